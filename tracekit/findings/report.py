"""Findings -> one ranked, size-bounded report document (the `--format json` output).

Ranking: severity first, then the share of the analysed window the finding costs, then its rule
and id so equal findings keep one order across runs. The report is bounded so an agent can take it
whole: at most `max_findings` findings, each already compact; what was cut is counted, not lost.

A report of more than MANY_RUNS runs (a job's ranks) folds the same finding on several ranks (same
rule, same locality but for the rank's own run, device, thread and clock; a finding located by its
rank alone, such as an outlier rank, is never folded) into its highest-ranked one, and `same_on_ranks` names the others by rank and id: on 64 ranks the 25 findings shown were one
G001 finding 25 times, and the straggler finding was among the 168 cut.
"""

from __future__ import annotations

import json

from tracekit import __version__
from tracekit.db.schema import SCHEMA_VERSION
from tracekit.findings.model import FINDING_SCHEMA_VERSION, SEVERITY_RANK, Finding

REPORT_VERSION = "1.1"
# More runs than this and the report folds the same finding on several ranks into one.
MANY_RUNS = 8
# Where on one rank a finding is: left out when matching it with the same finding on other ranks (a
# rank's device is its local rank, its threads and clock are its own).
_RANK_KEYS = frozenset({"run_id", "run_label", "rank", "device", "pid", "tid", "thread_name", "window_ns"})


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], -f.impact_share, f.rule, f.id))


def runs_section(con, run_ids=None) -> list[dict]:
    """The runs the report covers (`run_ids`; default every run of the database)."""
    rows = con.execute(
        """
        SELECT r.run_id, r.label, r.source, r.format, r.rank, r.world_size, r.start_ns, r.end_ns,
               l.events_read, l.events_ingested, l.events_skipped,
               json_extract_string(r.device_properties, '$[0].name') AS device
        FROM runs r LEFT JOIN ingest_log l ON l.run_id = r.run_id AND l.source = r.source
        WHERE $ids IS NULL OR list_contains($ids, r.run_id)
        ORDER BY r.run_id
        """,
        {"ids": None if run_ids is None else list(run_ids)},
    ).fetchall()
    keys = (
        "run_id label source format rank world_size start_ns end_ns events_read events_ingested events_skipped device"
    ).split()
    out = []
    for row in rows:
        item = dict(zip(keys, row))
        item["window_ns"] = (item["end_ns"] or 0) - (item["start_ns"] or 0)
        out.append(item)
    return out


def build_report(
    con, findings: list[Finding], notes: list, summary: dict, max_findings: int = 25, run_ids=None
) -> dict:
    records = [f.as_dict() for f in rank(findings)]
    return report_of_records(runs_section(con, run_ids), records, [n.as_dict() for n in notes], summary, max_findings)


def rank_records(records: list[dict]) -> list[dict]:
    """Finding records in the order `rank` gives their findings (the report's order)."""
    return sorted(
        records, key=lambda r: (-SEVERITY_RANK[r["severity"]], -r["impact"]["share_of_window"], r["rule"], r["id"])
    )


def report_of_records(runs: list[dict], records: list[dict], notes: list[dict], summary: dict,
                      max_findings: int = 25) -> dict:  # fmt: skip
    """The report document from its parts as plain data: the runs section, finding records, notes
    (as dicts) and the summary; what a cluster run's reducer builds from its workers' results."""
    ranked = rank_records(records)
    shown, same = fold(ranked) if len(runs) > MANY_RUNS else (ranked, {})
    kept = shown[:max_findings]
    counts = {s: sum(1 for r in records if r["severity"] == s) for s in SEVERITY_RANK}
    return {
        "report_version": REPORT_VERSION,
        "schema_version": SCHEMA_VERSION,
        "finding_schema_version": FINDING_SCHEMA_VERSION,
        "tracekit_version": __version__,
        "runs": runs,
        "summary": summary,
        "findings": kept,
        "findings_total": len(records),
        "findings_omitted": len(shown) - len(kept),
        "findings_folded": len(ranked) - len(shown),
        "same_on_ranks": {r["id"]: same[r["id"]] for r in kept if r["id"] in same},
        "severity_counts": counts,
        "data_quality": notes,
    }


def fold(ranked: list[dict]) -> tuple[list[dict], dict]:
    """(the first record of each group of the same finding on several ranks, in rank order;
    {its id: {"ranks", "ids", "impact_ns"}} for each group of two or more: every rank of the group,
    the other records' ids in rank order, and the smallest and largest impact)."""
    groups: dict[str, list[dict]] = {}
    for r in ranked:
        where = {k: v for k, v in (r.get("locality") or {}).items() if k not in _RANK_KEYS}
        # a finding located by its rank alone (R002's outlier ranks) is about that rank: never folded
        key = r["rule"] + json.dumps(where, sort_keys=True, default=str) if where else r["id"]
        groups.setdefault(key, []).append(r)
    shown = [members[0] for members in groups.values()]  # in rank order: a group is keyed at its first
    same = {}
    for members in groups.values():
        if len(members) > 1:
            impacts = [m["impact"]["time_ns"] for m in members]
            ranks = {(m.get("locality") or {}).get("rank") for m in members}
            same[members[0]["id"]] = {
                "ranks": sorted(r for r in ranks if r is not None),
                "ids": [m["id"] for m in members[1:]],
                "impact_ns": [min(impacts), max(impacts)],
            }
    return shown, same


def worst_severity(findings: list[Finding]) -> str | None:
    if not findings:
        return None
    return max((f.severity for f in findings), key=SEVERITY_RANK.__getitem__)
