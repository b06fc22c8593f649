"""The two reduce steps of a cluster run.

Reduce 1 (`number`) puts the chunks' runs on one numbering, the one a database of every input
would give (runs 1, 2, ... in input order), and the chunks' events on one event-id space; it
concatenates every chunk's collective counts (with those run ids) and extremes: what each chunk is
sent of the job's ranks (`work.Peers`).

Reduce 2 (`job_analysis`, `merge`) builds the reducer database: tracekit's schema with the views
`rank_collectives`, `rank_steps`, `rank_op_times`, `rank_op_inputs` and `cluster_step_components`
replaced by tables of the same names filled from the workers' summaries, and `runs`; every other table of a run is dropped, so a cross-rank
rule can read nothing but the summaries (DuckDB binds a view when it is queried, so
`collective_arrivals`, `rank_step_waits` and `job_collectives` read the tables). The "job" rules
run there, whichever exist; their findings and the workers' are ranked together as
`Trace.analysis` ranks them, and the notes are put in the order one database would give them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.cluster.work import SUMMARIES, Analyzed, EventShift, Ingested, Peers

# Tables the reducer keeps (besides the summaries it creates): the runs, what the analysis writes,
# and what the views over the summaries read.
KEPT_TABLES = ("runs", "findings", "ingest_pending", "peer_collectives", "peer_collective_counts", "tracekit_meta")


@dataclass
class Numbering:
    """Per chunk index: its run ids as ingested -> job-wide, and the events of the chunks before it."""

    remaps: dict[int, dict[int, int | None]]  # None: the run is dropped (a trace an earlier input holds)
    event_bases: dict[int, EventShift]
    peers: Peers | None  # every chunk's collective counts (job-wide run ids) and extremes
    duplicates: list[str]  # the inputs dropped as copies of earlier ones


def number(ingested: list[Ingested]) -> Numbering:
    """Reduce 1 over the chunks that were ingested (in chunk order)."""
    import pyarrow as pa

    remaps, bases, counts, extremes, seen, duplicates = {}, {}, [], [], {}, []
    next_run, events = 1, 0
    for item in sorted(ingested, key=lambda i: i.chunk.index):
        remap: dict[int, int | None] = {}
        gaps = []
        for old in sorted(item.runs.column("run_id").to_pylist()):
            digest, source = item.digests.get(old, (None, None))
            if digest is not None and seen.setdefault(digest, source) != source:
                remap[old] = None  # the same trace as an earlier input's: skipped, as one database skips it
                duplicates.append(f"{source}: same content given earlier as {seen[digest]}; not ingested again")
                if old in item.run_events:
                    gaps.append(item.run_events[old])
                continue
            remap[old] = next_run
            next_run += 1
        shift = EventShift(events, tuple(sorted(gaps)))
        remaps[item.chunk.index], bases[item.chunk.index] = remap, shift
        counts.append(_renumbered(item.peers.counts, remap, shift))
        extremes.append(item.peers.extremes)
        events += item.events - sum(n for _, n in gaps)
    peers = Peers(pa.concat_tables(counts), pa.concat_tables(extremes)) if counts else None
    return Numbering(remaps, bases, peers, duplicates)


def _renumbered(table, remap: dict[int, int | None], shift: EventShift):
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    dropped = [old for old, new in remap.items() if new is None]
    if dropped:
        table = table.filter(
            pc.invert(pc.is_in(table.column("run_id"), pa.array(dropped, table.schema.field("run_id").type)))
        )
    runs = [remap.get(r, r) for r in table.column("run_id").to_pylist()]
    run_field = table.schema.field("run_id")
    table = table.set_column(table.schema.get_field_index("run_id"), run_field, pa.array(runs, run_field.type))
    if shift != EventShift() and "event_id" in table.column_names:
        i = table.schema.get_field_index("event_id")
        shifted = [None if e is None else shift(e) for e in table.column(i).to_pylist()]
        table = table.set_column(i, table.schema.field(i), pa.array(shifted, table.schema.field(i).type))
    return table


def runs_job_rules(rules=None) -> bool:
    """Whether the selection holds a "job" rule, which reads the summaries' rows in the reducer."""
    from tracekit.engine.registry import all_rules, get_rule

    keys = [k.strip() for k in rules.split(",")] if isinstance(rules, str) else list(rules or [])
    return any(r.scope == "job" for r in ([get_rule(k) for k in keys if k] or all_rules()))


def job_database(analyzed: list[Analyzed]):
    """The reducer's Trace: an in-memory database of the summaries alone (see the module doc)."""
    import pyarrow as pa

    from tracekit import api
    from tracekit.db.connection import run_tables

    trace = api.open()
    con = trace.connection
    try:
        for table in run_tables(con):
            if table not in KEPT_TABLES:
                con.execute(f'DROP TABLE "{table}"')
        parts = sorted(analyzed, key=lambda a: a.chunk.index)
        for name in ("runs", *SUMMARIES):
            tables = [a.tables[name] for a in parts if a.tables.get(name) is not None]
            if not tables:
                continue
            rows = pa.concat_tables(tables, promote_options="permissive")
            from tracekit.db.connection import cursor

            cur = cursor(con)
            cur.register("tk_summary_rows", rows)
            if name == "runs":
                names = ", ".join(f'"{c}"' for c in rows.column_names)
                cur.execute(f"INSERT INTO runs ({names}) SELECT {names} FROM tk_summary_rows ORDER BY run_id")
            else:
                cur.execute(f'DROP VIEW IF EXISTS "{name}"')
                cur.execute(f'CREATE TABLE "{name}" AS SELECT * FROM tk_summary_rows')
            cur.close()
    except BaseException:
        trace.close()
        raise
    return trace.select()


def job_analysis(analyzed: list[Analyzed], rules=None, params=None) -> tuple[list[dict], list[dict]]:
    """Finding records and notes of the "job" rules, run over the summaries."""
    trace = job_database(analyzed)
    try:
        found = trace.analysis(rules, params, scope="job")
        return [f.as_dict() for f in found.findings], [n.as_dict() for n in found.notes]
    finally:
        trace.close()


def merge(analyzed: list[Analyzed], job_records: list[dict], job_notes: list[dict], rules=None) -> tuple[list, list]:
    """(records, notes) of the whole job, as one database of every input gives them.

    Records: every chunk's and the reducer's, ranked together (findings.report.rank_records).
    Notes: the data-quality checks' notes first (per run, in run order), then each rule's in rule
    order. A run rule that lacks an input in every chunk did not run at all in one database: it
    gets one "not run" note naming what every chunk lacks, and no findings. Otherwise its notes
    are the chunks' in order (a note of no run said by several chunks, once), less the "not run"
    notes of chunks that lacked an input the others had."""
    from tracekit.engine.registry import all_rules, get_rule
    from tracekit.findings.report import rank_records

    parts = sorted(analyzed, key=lambda a: a.chunk.index)
    keys = [k.strip() for k in rules.split(",")] if isinstance(rules, str) else list(rules or [])
    selected = [get_rule(k) for k in keys if k] or all_rules()
    records = list(job_records)
    notes = [n for a in parts for n in a.notes if _is_check(n)]
    notes = list({_note_key(n): n for n in notes}.values())
    for rule in selected:
        if rule.scope == "job":
            notes += [n for n in job_notes if n["rule"] == rule.code]
            continue
        lacking = [a.missing.get(rule.code) or [] for a in parts]
        everywhere = [
            m for m in (lacking[0] if lacking else []) if all(_relation(m) in map(_relation, o) for o in lacking)
        ]
        if parts and everywhere:
            notes.append(
                {"rule": rule.code, "run_id": None, "message": f"{rule.name} not run: needs {', '.join(everywhere)}"}
            )
            continue
        said = {}
        for a, lacks in zip(parts, lacking):
            if lacks:
                continue  # this chunk did not run it: its "not run" note is not the job's
            for n in a.notes:
                if n["rule"] == rule.code and not _is_check(n):
                    said.setdefault(_note_key(n), n)
            records += [r for r in a.records if r["rule"] == rule.code]
        notes += said.values()
    return rank_records(records), notes


def _is_check(note: dict) -> bool:
    return "check" in note or note["rule"] == "data-quality"


def _note_key(note: dict) -> tuple:
    return (note["rule"], note.get("run_id"), note["message"], note.get("check"))


def _relation(missing: str) -> str:
    return missing.split(" ", 1)[0]
