"""Generic Chrome trace events (from producers other than Kineto), resolved in SQL on the raw table.

Kineto writes only X, i, s, t, f, M (and C) events. Other producers (Chromium, Node.js, custom
writers) also use duration pairs (B/E), async spans (b/e/n, legacy S/T/p/F), flow v2 (`bind_id` with
`flow_in`/`flow_out`), scoped instants, samples and object, memory-dump and clock-sync events. When
a file holds any of these, `prepare` rewrites the raw table in place (an UPDATE keeps the row order,
so event ids still follow the file) and the loader's column expressions take the overrides it set:

- B/E: per (pid, tid) a stack. With S the running sum of +1 (B) / -1 (E) in (ts, file) order and
  M = min(0, running min of S), the stack depth is S - M: an E that would take it below zero is
  unmatched, and at each depth Bs and Es alternate, so the k-th B at a depth pairs with the k-th E
  there. Window functions and one equality join: linear in the events, whatever the nesting.
- async: the same stack per (cat, scope, id, name); the span goes to the track of (cat, scope, id),
  so the spans of one id nest among themselves and not with the thread's slices.
- a B or b never closed is kept, with its duration running to the last timestamp of the trace,
  and flagged `"unterminated": true` in extra (Chromium writes the slices open at the end of the
  capture this way). An end with no begin is skipped with its reason.
"""

from __future__ import annotations

# Event keys only generic producers use. Read when the file's first MiB or its phases show a generic
# trace (kineto.load reloads with them when only the full read shows it): each column read costs
# Kineto files parse time. Extra (unknown-key) handling stays as it was.
GENERIC_COLUMNS = {"id2": "JSON", "bind_id": "JSON", "flow_in": "JSON", "flow_out": "JSON", "scope": "JSON"}

KINETO_PHASES = ("X", "i", "I", "s", "t", "f", "M", "C")
KINETO_PHASES_SQL = ", ".join("'" + p + "'" for p in KINETO_PHASES)  # for `ph NOT IN (...)`

# ph -> reason for events the schema has no home for
NOT_INGESTED = {
    "N": "object created (ph N) not ingested",
    "O": "object snapshot (ph O) not ingested",
    "D": "object destroyed (ph D) not ingested",
    "c": "clock sync (ph c) not ingested",
    "v": "memory dump (ph v) not ingested",
    "V": "memory dump (ph V) not ingested",
    "(": "context enter (ph () not ingested",
    ")": "context leave (ph )) not ingested",
    "=": "linked id (ph =) not ingested",
}
KNOWN_PHASES = set(KINETO_PHASES) | set(NOT_INGESTED) | set("BEbenSTpFPR")

# columns the loader reads back (see kineto._load): NULL means "as Kineto would derive it"
OVERRIDES = {"_skip": "VARCHAR", "_kind": "VARCHAR", "_track": "VARCHAR", "_flow_id": "VARCHAR", "_flag": "JSON"}
PAIRED = "_paired"  # _kind of an end event folded into its begin: not a row, not a skip


def _q(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def needs_generic(con, raw: str, with_keys: bool, params: dict | None = None) -> bool:
    """Whether the loaded events (`raw`: a table, or a subquery with its `params`) hold a phase (or,
    when those columns were read, a key) Kineto never writes."""
    keys = " OR ".join(f"{k} IS NOT NULL" for k in GENERIC_COLUMNS if k != "scope") if with_keys else "false"
    query = f"SELECT EXISTS (SELECT 1 FROM {raw} WHERE ph NOT IN ({KINETO_PHASES_SQL}) OR {keys})"
    return con.execute(query, params).fetchone()[0]


def _stack_pairs(con, raw: str, where: str, key: str, begin: str, end: str) -> None:
    """Temp table _pairs(b, e, e_ts, e_args) for every begin (e NULL when never closed), and
    _orphans(rid) for the ends with no open begin, matching begins and ends as a stack per key."""
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE _stack AS
        WITH x AS (
            SELECT rowid AS rid, ph = {_q(begin)} AS is_begin, ts, args, {key} AS k,
                   sum(CASE WHEN ph = {_q(begin)} THEN 1 ELSE -1 END) OVER w AS s
            FROM {raw} WHERE {where} AND ph IN ({_q(begin)}, {_q(end)}) AND ts IS NOT NULL
            WINDOW w AS (PARTITION BY {key} ORDER BY ts, rowid ROWS UNBOUNDED PRECEDING)
        ), y AS (
            SELECT *, least(0, coalesce(min(s) OVER (PARTITION BY k ORDER BY ts, rid
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) AS m_prev
            FROM x
        )
        -- depth after a begin is s - m; before a matched end, (s + 1) - m_prev; an end below m_prev has no begin
        SELECT rid, is_begin, ts, args, k, NOT is_begin AND s < m_prev AS orphan,
               CASE WHEN is_begin THEN s - least(m_prev, s) ELSE s + 1 - m_prev END AS level
        FROM y
        """
    )
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _pairs AS
        WITH b AS (SELECT rid, k, level, row_number() OVER (PARTITION BY k, level ORDER BY ts, rid) AS n
                   FROM _stack WHERE is_begin),
             e AS (SELECT rid, ts, args, k, level, row_number() OVER (PARTITION BY k, level ORDER BY ts, rid) AS n
                   FROM _stack WHERE NOT is_begin AND NOT orphan)
        SELECT b.rid AS b, e.rid AS e, e.ts AS e_ts, e.args AS e_args FROM b LEFT JOIN e USING (k, level, n)
        """
    )
    con.execute("CREATE OR REPLACE TEMP TABLE _orphans AS SELECT rid FROM _stack WHERE orphan")
    con.execute("DROP TABLE _stack")


def _apply_pairs(con, raw: str, end_ts: str, kind: str | None, track: str | None, what: str, end_ph: str) -> dict:
    """Fold each end into its begin (a complete event), flag begins never closed, skip lone ends."""
    kind_sql = _q(kind) if kind else "NULL"
    track_sql = track or "NULL"
    con.execute(
        f"""
        UPDATE {raw} SET
            ph = 'X',
            dur = CAST(coalesce(p.e_ts, {end_ts}) - {raw}.ts AS DOUBLE),
            args = CASE WHEN p.e_args IS NULL OR p.e_args = '{{}}' THEN {raw}.args
                        WHEN {raw}.args IS NULL THEN p.e_args
                        ELSE json_merge_patch({raw}.args, p.e_args) END,
            _kind = {kind_sql},
            _track = {track_sql},
            _flag = CASE WHEN p.e IS NULL THEN json_object('unterminated', true, 'ph', {raw}.ph)
                         ELSE json_object('ph', {raw}.ph || '/' || {_q(end_ph)}) END
        FROM _pairs p WHERE {raw}.rowid = p.b
        """
    )
    con.execute(f"UPDATE {raw} SET _kind = '{PAIRED}' FROM _pairs p WHERE {raw}.rowid = p.e")
    con.execute(
        f"UPDATE {raw} SET _skip = {_q(f'{what} end (ph {end_ph}) without a matching begin')} "
        f"FROM _orphans o WHERE {raw}.rowid = o.rid"
    )
    pairs, open_ = con.execute("SELECT count(e), count(*) - count(e) FROM _pairs").fetchone()
    orphans = con.execute("SELECT count(*) FROM _orphans").fetchone()[0]
    con.execute("DROP TABLE _pairs")
    con.execute("DROP TABLE _orphans")
    return {"pairs": pairs, "unterminated": open_, "unmatched_ends": orphans}


# async identity: plain `id` and id2.global are global, id2.local belongs to the process (as in
# Catapult); the scope key, when given, separates id spaces
ASYNC_ID = "coalesce(id, json_extract_string(id2, '$.global'), pid || ':' || json_extract_string(id2, '$.local'))"
ASYNC_TRACK = (
    f"'async/' || coalesce(json_extract_string(scope, '$') || '/', '') || coalesce(cat, '') || '/' || {ASYNC_ID}"
)


def prepare(con, raw: str) -> dict:
    """Rewrite the raw table of a generic Chrome trace in place; returns notes for the ingest log."""
    for column, type_ in OVERRIDES.items():
        con.execute(f"ALTER TABLE {raw} ADD COLUMN {column} {type_}")
    end_ts = con.execute(
        f"SELECT max(CASE WHEN dur > 0 THEN ts + dur ELSE ts END) FROM {raw} WHERE ph <> 'M' AND ph IS NOT NULL"
    ).fetchone()[0]
    end_sql = "NULL" if end_ts is None else repr(float(end_ts))
    notes: dict = {"chrome_json": "generic Chrome trace events: B/E and async pairs resolved (docs/schema.md)"}

    _stack_pairs(con, raw, "true", "hash(pid, tid)", "B", "E")
    notes["duration_pairs"] = _apply_pairs(con, raw, end_sql, None, None, "duration", "E")

    async_pair_key = f"hash(json_extract_string(scope, '$'), cat, {ASYNC_ID}, name)"
    _stack_pairs(con, raw, f"{ASYNC_ID} IS NOT NULL", async_pair_key, "b", "e")
    notes["async_pairs"] = _apply_pairs(con, raw, end_sql, "async", ASYNC_TRACK, "async", "e")
    _stack_pairs(con, raw, f"{ASYNC_ID} IS NOT NULL", async_pair_key, "S", "F")
    legacy = _apply_pairs(con, raw, end_sql, "async", ASYNC_TRACK, "legacy async", "F")
    if any(legacy.values()):
        notes["legacy_async_pairs"] = legacy

    # async instants (n) and legacy steps (T, p) sit on their id's track
    con.execute(
        f"UPDATE {raw} SET _kind = 'async', _track = {ASYNC_TRACK} WHERE ph IN ('n', 'T', 'p') AND {ASYNC_ID} IS NOT NULL"
    )
    con.execute(
        f"""UPDATE {raw} SET _skip = 'async event (ph ' || ph || ') without id'
            WHERE ph IN ('b', 'e', 'n', 'S', 'T', 'p', 'F') AND {ASYNC_ID} IS NULL AND _kind IS NULL"""
    )
    # an async span belongs to its id's track, not to the thread that happened to emit it (that is kept
    # in extra.tid), so the spans of one id nest together whichever threads begin and end them
    con.execute(
        f"UPDATE {raw} SET _flag = json_merge_patch(coalesce(_flag, '{{}}'::JSON), json_object('tid', tid)) "
        "WHERE _kind = 'async'"
    )
    # instant scope: global and process instants are not on a thread
    con.execute(
        f"""UPDATE {raw} SET _track = CASE s WHEN 'g' THEN 'global' ELSE pid || '/process' END
            WHERE ph IN ('i', 'I') AND s IN ('g', 'p')"""
    )
    con.execute(f"UPDATE {raw} SET _kind = 'sample' WHERE ph = 'P'")
    con.execute(f"UPDATE {raw} SET _kind = 'instant' WHERE ph = 'R' AND cat IS NULL")
    # a counter with an id is its own series set (the spec: the counter's name is name + id)
    con.execute(f"UPDATE {raw} SET name = name || '[' || id || ']' WHERE ph = 'C' AND id IS NOT NULL")
    con.execute(
        f"""UPDATE {raw} SET _flow_id = coalesce(json_extract_string(id2, '$.global'),
                                                  pid || ':' || json_extract_string(id2, '$.local'))
            WHERE ph IN ('s', 't', 'f') AND id IS NULL"""
    )
    for ph, reason in NOT_INGESTED.items():
        con.execute(f"UPDATE {raw} SET _skip = ? WHERE ph = ?", [reason, ph])
    known = ", ".join(_q(p) for p in sorted(KNOWN_PHASES))
    con.execute(f"UPDATE {raw} SET _skip = 'unknown ph ' || ph WHERE ph NOT IN ({known})")
    return notes


def _truthy(column: str) -> str:
    return f"coalesce(TRY_CAST(json_extract_string({column}, '$') AS BOOLEAN), false)"


FLOW_V2_CAT = "flow_v2"


def flow_v2_sql(raw: str, run_id: int, ts_ns: str, pid_n: str, tid_n: str, track: str) -> str:
    """Rows of kind flow for the slices that bind a v2 flow: ph s (flow_out), f (flow_in) or t (both,
    a step), cat flow_v2 (the two ends' categories may differ; bind_id alone is the key), flow_id =
    bind_id, on the slice's track and start. Appended after the run's events, in file order."""
    flow_in, flow_out = _truthy("flow_in"), _truthy("flow_out")
    bind = "coalesce(json_extract_string(bind_id, '$'), id)"
    return f"""
    INSERT INTO event_rows
    SELECT {run_id}, 'flow',
           CASE WHEN {flow_in} AND {flow_out} THEN 't' WHEN {flow_out} THEN 's' ELSE 'f' END,
           '{FLOW_V2_CAT}', name, {ts_ns}, NULL, {pid_n}, {tid_n}, {track}, NULL, NULL, NULL, NULL, {bind},
           NULL, json_object('bound_slice_ph', coalesce(_flag->>'ph', ph), 'bound_slice_cat', cat), NULL, NULL
    FROM {raw}
    WHERE ({flow_in} OR {flow_out}) AND {bind} IS NOT NULL AND ph = 'X' AND _skip IS NULL AND ts IS NOT NULL
    ORDER BY rowid
    """
