"""msprof-analyze cluster analysis outputs -> run_metrics of one multi-rank job (no events).

Two forms hold the same analysis: the `cluster_analysis_output/` folder (cluster_step_trace_time.csv,
cluster_communication.json, cluster_communication_matrix.json, communication_group.json) and the
`cluster_analysis.db` SQLite export (ClusterStepTraceTime, ClusterCommAnalyzerTime,
ClusterCommAnalyzerBandwidth, ClusterCommAnalyzerMatrix, CommunicationGroup). Both become:

- per (step, rank) step components, us -> ns: `cluster_step.<component>_ns` with args
  {"step", "rank", "stage", "source"} (stage rows: args {"step", "stage": ranks, "source"});
- per (group, step, op, rank) communication time: `cluster_comm.<elapse|transit|wait|...>_ns`;
- per (group, step, op, rank, transport) bandwidth: `cluster_comm.bandwidth_gbps`, `.transit_size_mb`;
- per (group, step, op, src-dst link) matrix bandwidth: `cluster_link.bandwidth_gbps`, ...;
- the communication groups in runs.metadata, the world size from the ranks seen.

The `cluster_step_components` view (tracekit/db/views/74_cluster.sql) turns the step metrics back
into one row per (run, step, rank).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import orjson

from tracekit.errors import InputError
from tracekit.parsers import sqlite_files
from tracekit.parsers.ascend_files import json_file, ns, number, table
from tracekit.parsers.rows import Export

FORMAT = "msprof_cluster"
DESCRIPTION = "msprof-analyze cluster analysis (cluster_analysis_output/ or cluster_analysis.db)"

STEP_CSV = "cluster_step_trace_time.csv"
FOLDER_FILES = (STEP_CSV, "cluster_communication.json", "cluster_communication_matrix.json")
DB_TABLES = ("ClusterStepTraceTime", "ClusterCommAnalyzerTime", "ClusterCommAnalyzerBandwidth",
             "ClusterCommAnalyzerMatrix", "CommunicationGroup")  # fmt: skip

# the CSV's step components (us) and the db's column of each
COMPONENTS = {"Computing": "computing", "Communication(Not Overlapped)": "communication_not_overlapped",
              "Overlapped": "overlapped", "Communication": "communication", "Free": "free", "Stage": "stage",
              "Bubble": "bubble",
              "Communication(Not Overlapped and Exclude Receive)": "communication_not_overlapped_and_exclude_receive"}  # fmt: skip
TIME_KEYS = {"Elapse Time(ms)": "elapsed_time", "Transit Time(ms)": "transit_time", "Wait Time(ms)": "wait_time",
             "Synchronization Time(ms)": "synchronization_time", "Idle Time(ms)": "idle_time"}  # fmt: skip


def sniff(head: bytes, name: str, **_) -> bool:
    """A SQLite file whose schema (in its first pages) creates msprof-analyze's cluster tables."""
    return head[:16] == sqlite_files.MAGIC and all(f"CREATE TABLE {t}(".encode() in head or f"CREATE TABLE {t} (".encode() in head
                                      for t in ("ClusterStepTraceTime", "ClusterCommAnalyzerTime"))  # fmt: skip


def claims(folder: Path) -> bool:
    try:
        return all((Path(folder) / name).is_file() for name in FOLDER_FILES)
    except OSError:
        return False


def read(path: Path, **_) -> Export:
    path = Path(path)
    out = Export(source=path, format=FORMAT)
    ranks: set[int] = set()
    if path.is_dir():
        _read_folder(path, out, ranks)
    else:
        _read_db(path, out, ranks)
    out.world_size = len(ranks) or None
    out.metadata["ranks"] = sorted(ranks)
    return out


def _metric(out: Export, name: str, value, unit: str, args: dict) -> None:
    out.metrics.append((name, float(value), unit, orjson.dumps(args).decode()))


def _ranks_text(text: str) -> list[int]:
    return [int(r) for r in re.findall(r"\d+", text)]


def _step(text) -> int | str:
    m = re.fullmatch(r"(?:step)?(\d+)", str(text).strip())
    return int(m[1]) if m else str(text)


def _step_row(out: Export, ranks: set, source: str, step, kind: str, index: str, values: dict) -> str | None:
    """Metrics of one step-trace row (a rank's or a stage's); the reason when it is skipped."""
    if kind not in ("rank", "stage"):
        return f"step-trace row of type {kind!r}"
    numbers = {col: ns(v) for col, v in values.items()}
    if any(v is None for v in numbers.values()):
        return "step-trace row with a component not a number"
    args = {"step": _step(step), "source": source}
    if kind == "rank":
        rank = number(str(index))
        if not isinstance(rank, int):
            return "rank row whose index is not a rank"
        ranks.add(rank)
        args["rank"] = rank
        args["stage"] = numbers.get("stage")
    else:
        args["stage_ranks"] = _ranks_text(str(index))
    prefix = "cluster_step" if kind == "rank" else "cluster_stage"
    for col, value in numbers.items():
        _metric(out, f"{prefix}.{col}_ns", value, "ns", args)
    return None


# ---- cluster_analysis_output/ ----------------------------------------------------------------------


def _read_folder(path: Path, out: Export, ranks: set) -> None:
    file = path / STEP_CSV
    rows = table(file, ("Step", "Type", "Index", *COMPONENTS))
    for _, row in rows:
        out.read[f"{STEP_CSV} row"] += 1
        values = {db: row[csv] for csv, db in COMPONENTS.items()}
        reason = _step_row(out, ranks, STEP_CSV, row["Step"], row["Type"], row["Index"], values)
        if reason:
            out.skipped[f"{STEP_CSV}: {reason}"] += 1
    _read_comm_json(path / "cluster_communication.json", out, ranks)
    _read_matrix_json(path / "cluster_communication_matrix.json", out)
    groups = path / "communication_group.json"
    if groups.is_file():
        data = json_file(groups)
        if not isinstance(data, dict):
            raise InputError(groups, "byte 0", "a JSON object of group kind -> rank lists")
        out.metadata["communication_groups"] = data
    for other in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in (*FOLDER_FILES, groups.name)):
        out.read["file"] += 1
        out.skipped["file not read: not a cluster analysis output tracekit maps"] += 1


def _nested(file: Path, depth: int):
    """The JSON's (group, step, op, key, value) leaves: group -> step -> op -> key (rank or link)."""
    data = json_file(file)
    if not isinstance(data, dict):
        raise InputError(file, "byte 0", "a JSON object: group -> step -> op -> rank or link")
    for group, steps in data.items():
        if not isinstance(steps, dict):
            raise InputError(file, f"group {group!r}", "an object of steps")
        for step, ops in steps.items():
            if not isinstance(ops, dict):
                raise InputError(file, f"group {group!r} {step}", "an object of ops")
            for op, entries in ops.items():
                if not isinstance(entries, dict):
                    raise InputError(file, f"group {group!r} {step} {op!r}", "an object by rank or link")
                for key, value in entries.items():
                    yield group, step, op, key, value


def _read_comm_json(file: Path, out: Export, ranks: set) -> None:
    for group, step, op, rank, info in _nested(file, 4):
        out.read["cluster_communication.json op rank"] += 1
        if not isinstance(info, dict) or not isinstance(info.get("Communication Time Info"), dict):
            out.skipped["cluster_communication.json: entry without Communication Time Info"] += 1
            continue
        args = {"group": group, "step": _step(step), "op": op, "rank": number(rank), "source": file.name}
        times = info["Communication Time Info"]
        for key, name in TIME_KEYS.items():
            value = ns(times.get(key), 10**6)
            if value is not None:
                _metric(out, f"cluster_comm.{name}_ns", value, "ns", args)
        for transport, band in (info.get("Communication Bandwidth Info") or {}).items():
            if isinstance(band, dict) and band.get("Transit Size(MB)"):
                _bandwidth(out, {**args, "transport": transport}, band.get("Bandwidth(GB/s)"),
                           band.get("Transit Size(MB)"), band.get("Transit Time(ms)"))  # fmt: skip


def _bandwidth(out: Export, args: dict, gbps, size_mb, time_ms, prefix: str = "cluster_comm") -> None:
    for name, value, unit in (("bandwidth_gbps", gbps, "GB/s"), ("transit_size_mb", size_mb, "MB"),
                              ("transit_time_ns", ns(time_ms, 10**6) if time_ms is not None else None, "ns")):  # fmt: skip
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            _metric(out, f"{prefix}.{name}", value, unit, args)


def _read_matrix_json(file: Path, out: Export) -> None:
    for group, step, op, link, info in _nested(file, 4):
        out.read["cluster_communication_matrix.json link"] += 1
        src, _, dst = str(link).partition("-")
        if not isinstance(info, dict) or not (src.isdigit() and dst.isdigit()):
            out.skipped["cluster_communication_matrix.json: entry not a src-dst link"] += 1
            continue
        args = {"group": group, "step": _step(step), "op": op, "src_rank": int(src), "dst_rank": int(dst),
                "transport": info.get("Transport Type"), "source": file.name}  # fmt: skip
        _bandwidth(out, args, info.get("Bandwidth(GB/s)"), info.get("Transit Size(MB)"), info.get("Transit Time(ms)"),
                   prefix="cluster_link")  # fmt: skip


# ---- cluster_analysis.db -----------------------------------------------------------------------------


def _columns(con, path: Path, name: str, needed: tuple) -> list[str]:
    columns = [r[1] for r in con.execute(f'PRAGMA table_info("{name}")')]
    if not columns:
        raise InputError(path, f"table {name}", f"table {name} (msprof-analyze cluster_analysis.db)")
    missing = [c for c in needed if c not in columns]
    if missing:
        raise InputError(path, f"table {name}", f"column {missing[0]!r} (has: {', '.join(columns)})")
    return columns


def _select(con, path: Path, name: str, needed: tuple):
    _columns(con, path, name, needed)
    cols = ", ".join(f'"{c}"' for c in needed)
    try:
        return con.execute(f'SELECT {cols} FROM "{name}"').fetchall()
    except sqlite3.DatabaseError as exc:
        raise InputError(path, f"table {name}", f"a readable SQLite table ({exc})") from None


def _read_db(path: Path, out: Export, ranks: set) -> None:
    try:
        con = sqlite_files.connect(path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise InputError(path, "byte 0", f"a readable SQLite database ({exc})") from None
    try:
        missing = [t for t in DB_TABLES[:2] if t not in tables]
        if missing:
            raise InputError(path, "sqlite_master", f"table {missing[0]} (msprof-analyze cluster_analysis.db)")
        _db_steps(con, path, out, ranks)
        _db_times(con, path, out)
        if "ClusterCommAnalyzerBandwidth" in tables:
            _db_bandwidth(con, path, out)
        if "ClusterCommAnalyzerMatrix" in tables:
            _db_matrix(con, path, out)
        if "CommunicationGroup" in tables:
            groups: dict = {}
            for kind, rank_set in _select(con, path, "CommunicationGroup", ("type", "rank_set")):
                out.read["CommunicationGroup row"] += 1
                groups.setdefault(kind, []).append(_ranks_text(str(rank_set)))
            out.metadata["communication_groups"] = groups
        for other in sorted(tables - set(DB_TABLES)):
            count = con.execute(f'SELECT count(*) FROM "{other}"').fetchone()[0]
            out.read[f"{other} row"] += count
            out.skipped[f"{other}: table not mapped"] += count
    finally:
        con.close()


def _db_steps(con, path: Path, out: Export, ranks: set) -> None:
    columns = _columns(con, path, "ClusterStepTraceTime", ("step", "type", "index", "computing", "free"))
    present = [c for c in COMPONENTS.values() if c in columns]
    for row in _select(con, path, "ClusterStepTraceTime", ("step", "type", "index", *present)):
        out.read["ClusterStepTraceTime row"] += 1
        values = {c: None if v is None else str(v) for c, v in zip(present, row[3:])}
        reason = _step_row(out, ranks, "ClusterStepTraceTime", row[0], row[1], row[2], values)
        if reason:
            out.skipped[f"ClusterStepTraceTime: {reason}"] += 1


def _db_times(con, path: Path, out: Export) -> None:
    keys = tuple(TIME_KEYS.values())
    for row in _select(con, path, "ClusterCommAnalyzerTime", ("rank_set", "step", "rank_id", "hccl_op_name", *keys)):
        out.read["ClusterCommAnalyzerTime row"] += 1
        args = {
            "group": row[0],
            "step": _step(row[1]),
            "op": row[3],
            "rank": row[2],
            "source": "ClusterCommAnalyzerTime",
        }
        for name, value in zip(keys, row[4:]):
            if (value := ns(value, 10**6) if value is not None else None) is not None:
                _metric(out, f"cluster_comm.{name}_ns", value, "ns", args)


def _db_bandwidth(con, path: Path, out: Export) -> None:
    needed = ("rank_set", "step", "rank_id", "hccl_op_name", "band_type", "transit_size", "transit_time", "bandwidth",
              "package_size", "count")  # fmt: skip
    seen = set()
    for row in _select(con, path, "ClusterCommAnalyzerBandwidth", needed):
        out.read["ClusterCommAnalyzerBandwidth row"] += 1
        key = row[:5]
        if key in seen:  # one row per packet size: the op's totals repeat on each
            out.skipped["ClusterCommAnalyzerBandwidth: another packet-size row of the same op and transport"] += 1
            continue
        seen.add(key)
        if not row[5]:
            out.skipped["ClusterCommAnalyzerBandwidth: transport that moved nothing"] += 1
            continue
        args = {"group": row[0], "step": _step(row[1]), "op": row[3], "rank": row[2], "transport": row[4],
                "source": "ClusterCommAnalyzerBandwidth"}  # fmt: skip
        _bandwidth(out, args, row[7], row[5], row[6])


def _db_matrix(con, path: Path, out: Export) -> None:
    needed = ("rank_set", "step", "hccl_op_name", "src_rank", "dst_rank", "transit_size", "transit_time", "bandwidth",
              "transport_type")  # fmt: skip
    for row in _select(con, path, "ClusterCommAnalyzerMatrix", needed):
        out.read["ClusterCommAnalyzerMatrix row"] += 1
        src, dst = number(str(row[3])), number(str(row[4]))
        if not isinstance(src, int) or not isinstance(dst, int):
            out.skipped["ClusterCommAnalyzerMatrix: src or dst not a rank"] += 1
            continue
        args = {"group": row[0], "step": _step(row[1]), "op": row[2], "src_rank": src, "dst_rank": dst,
                "transport": row[8], "source": "ClusterCommAnalyzerMatrix"}  # fmt: skip
        _bandwidth(out, args, row[7], row[5], row[6], prefix="cluster_link")
