"""One run from several sources: explicit offsets, measured window alignment, and the one-line answer
for a file no reader takes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, sample
from tracekit.errors import TracekitError
from tracekit.ingest.offsets import TZ_STEP_NS, measure, parse_duration, parse_offsets
from tracekit.ingest.pipeline import ingest

TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
DEMO_TRACE = sample("runtime_demo.json.gz")
DEMO_LOG = sample("runtime_demo.events.jsonl")
H = 3_600_000_000_000


@pytest.mark.parametrize(
    "text, ns",
    [
        ("-7h", -7 * H),
        ("+1.5s", 1_500_000_000),
        ("250ms", 250_000_000),
        ("120", 120),
        ("-3us", -3000),
        ("+30m", H // 2),
    ],
)
def test_durations(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("bad", ["7 hours", "", "--1s", "1e3s", "+s"])
def test_bad_durations_are_refused(bad):
    with pytest.raises(TracekitError, match="expected a signed duration"):
        parse_duration(bad)


def test_offset_specs_name_one_input(tmp_path):
    a, b = tmp_path / "x" / "server.log", tmp_path / "y" / "server.log"
    assert parse_offsets([f"{DEMO_LOG.name}=+1ms"], [DEMO_TRACE, DEMO_LOG]) == {DEMO_LOG: 1_000_000}
    assert parse_offsets([f"{a}=-1h"], [a, b]) == {a: -H}
    with pytest.raises(TracekitError, match="several inputs"):
        parse_offsets(["server.log=-1h"], [a, b])
    with pytest.raises(TracekitError, match="matches no input"):
        parse_offsets(["other.log=1s"], [a])
    with pytest.raises(TracekitError, match="FILE=DURATION"):
        parse_offsets(["-1h"], [a])


def test_window_alignment_same_clock_time_zone_and_ambiguous():
    trace = (1_000 * H, 1_000 * H + 5_000_000_000)  # a 5 s profile
    assert measure(trace, (trace[0] - H, trace[1] + H))["applied_offset_ns"] == 0
    # a log written in UTC+2 local time, covering 10 minutes around the profile: only -2 h fits
    log = (trace[0] + 2 * H - 300_000_000_000, trace[0] + 2 * H + 300_000_000_000)
    shift = measure(trace, log)
    assert shift["applied_offset_ns"] == -2 * H and "time zone" in shift["method"]
    # a log spanning 2 hours fits many 15-minute shifts: none is guessed
    long_log = (trace[0] + 5 * H, trace[0] + 7 * H)
    shift = measure(trace, long_log)
    assert shift["applied_offset_ns"] == 0 and "--offset" in shift["note"]
    assert (long_log[1] - long_log[0]) // TZ_STEP_NS > 1
    # a log that never covers the profile under any shift
    assert measure(trace, (trace[0] + 20 * H, trace[0] + 20 * H + 1))["method"] == "none"


def _runtime_ts(con, name: str) -> list[int]:
    return [r[0] for r in con.execute(
        "SELECT ts_ns FROM event_rows WHERE kind = 'runtime_event' AND name = ? ORDER BY ts_ns", [name]
    ).fetchall()]  # fmt: skip


def test_explicit_offset_overrides_the_measured_one(fresh_db):
    from tracekit import db

    measured = db.connect(None)
    [_, log_measured] = ingest(measured, [DEMO_TRACE, DEMO_LOG])
    applied = log_measured.alignment["applied_offset_ns"]
    [_, log_explicit] = ingest(fresh_db, [DEMO_TRACE, DEMO_LOG], offsets={DEMO_LOG: 5_000_000})
    assert log_explicit.alignment["method"] == "--offset" and log_explicit.alignment["applied_offset_ns"] == 5_000_000
    name = measured.execute("SELECT name FROM event_rows WHERE kind = 'runtime_event' LIMIT 1").fetchone()[0]
    a, b = _runtime_ts(measured, name), _runtime_ts(fresh_db, name)
    assert a and len(a) == len(b)
    assert {y - x for x, y in zip(a, b)} == {5_000_000 - applied}
    # the measurement itself is still reported next to the override
    notes = json.loads(fresh_db.execute(
        "SELECT notes FROM ingest_log WHERE source = ?", [str(DEMO_LOG)]).fetchone()[0])  # fmt: skip
    assert notes["alignment"]["pairs"] > 0


def test_offset_shifts_a_whole_trace(fresh_db):
    from tracekit import db

    plain = db.connect(None)
    ingest(plain, [DEMO_TRACE])
    ingest(fresh_db, [DEMO_TRACE], offsets={DEMO_TRACE: -H})
    q = "SELECT min(ts_ns), max(ts_ns), count(*) FROM event_rows WHERE ts_ns IS NOT NULL"
    (a0, a1, n), (b0, b1, m) = plain.execute(q).fetchone(), fresh_db.execute(q).fetchone()
    assert n == m and (b0, b1) == (a0 - H, a1 - H)
    r0 = plain.execute("SELECT start_ns FROM runs").fetchone()[0]
    assert fresh_db.execute("SELECT start_ns FROM runs").fetchone()[0] == r0 - H


def run(*args):
    return subprocess.run([TRACEKIT, *map(str, args)], capture_output=True, text=True, timeout=300)


def _one_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_unknown_content_names_what_was_tried(tmp_path):
    text = tmp_path / "notes.json"  # the extension says JSON, the content does not
    text.write_text("GPU went brrr\n")
    line = _one_line(run("analyze", text))
    assert str(text) in line and "byte 0" in line
    for fmt in ("Chrome/Kineto", "Nsight Systems SQLite", "Perfetto protobuf", "OTLP", "SGLang/vLLM"):
        assert fmt in line


def test_native_reports_say_how_to_export(tmp_path):
    ncu_rep = CORPUS / "esmm__profile_output.ncu-rep"
    if not ncu_rep.exists():
        pytest.skip("corpus not present")
    # a PATH with only the venv: no ncu or nsys to export with
    line = _one_line(subprocess.run([TRACEKIT, "analyze", str(ncu_rep)], capture_output=True, text=True,
                                    env={"PATH": str(Path(sys.executable).parent)}))  # fmt: skip
    assert "ncu --import" in line and "--csv" in line
    rep = tmp_path / "capture.nsys-rep"
    rep.write_bytes(b"\x00" * 64)
    line = _one_line(subprocess.run([TRACEKIT, "ingest", str(rep), "--db", str(tmp_path / "x.duckdb")],
                                    capture_output=True, text=True, env={"PATH": str(Path(sys.executable).parent)}))  # fmt: skip
    assert "nsys export --type sqlite" in line


def test_bad_offset_is_one_line(tmp_path):
    line = _one_line(run("analyze", DEMO_TRACE, "--offset", "nothere.log=1s"))
    assert "matches no input" in line


def test_native_report_is_exported_by_the_tool_on_path(tmp_path):
    """With `ncu` on PATH a .ncu-rep is exported (`ncu --import X --csv --page raw`) and read as that CSV.

    The stand-in `ncu` prints one of the project's own ncu CSVs; the command line it was given is
    checked, so the plumbing (not ncu) is what this tests. The real export was checked on the device
    with ncu 2025.3.1 on the corpus report (esmm__profile_output.ncu-rep: 4 launches, 1244 metrics).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    csv = sample("ncu_tiles_repeated_heavy.csv")
    argv_log = tmp_path / "argv.txt"
    (bin_dir / "ncu").write_text(f'#!/bin/sh\necho "$@" > {argv_log}\ncat {csv}\n')
    (bin_dir / "ncu").chmod(0o755)
    rep = tmp_path / "kernels.ncu-rep"
    rep.write_bytes(b"NVIDIA Nsight Compute report stand-in")
    env = {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    proc = subprocess.run([TRACEKIT, "ingest", str(rep), "--db", str(tmp_path / "k.duckdb"), "-f", "json"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert argv_log.read_text().split() == ["--import", str(rep), "--csv", "--page", "raw"]
    [result] = json.loads(proc.stdout)
    assert (
        result["events_ingested"] > 0 and result["events_read"] == result["events_ingested"] + result["events_skipped"]
    )


def test_server_log_joins_the_trace_run_on_its_clock(fresh_db):
    """`analyze trace.json.gz server.log`: one run; the log's rows shifted by the offset given, the
    run's window still the profiler's, the alignment used reported per file."""
    from tests.conftest import corpus
    from tracekit import db

    trace, log = sample("cpu_two_threads.json.gz"), corpus("energyllm__vllm_server.log")
    alone = db.connect(None)
    [own] = ingest(alone, [log])
    assert own.format == "serving_log"
    q = "SELECT min(ts_ns), count(*) FROM event_rows WHERE kind = 'counter'"
    log_start, n = alone.execute(q).fetchone()
    assert n > 0

    results = ingest(fresh_db, [trace, log])
    assert [r.run_id for r in results] == [1, 1] and results[1].format == "serving_log"
    # a 2025 server log and this trace do not overlap under any time-zone shift: left as written, said so
    assert results[1].alignment["method"] == "none" and "--offset" in results[1].alignment["note"]
    assert fresh_db.execute(q).fetchone() == (log_start, n)
    window = fresh_db.execute("SELECT start_ns, end_ns FROM runs").fetchone()
    plain = db.connect(None)
    ingest(plain, [trace])
    assert window == plain.execute("SELECT start_ns, end_ns FROM runs").fetchone()  # the profiler's window

    shifted = db.connect(None)
    offset = window[0] - log_start  # put the log's first statistic at the trace's start
    results = ingest(shifted, [trace, log], offsets={log: offset})
    assert results[1].alignment == {"method": "--offset", "applied_offset_ns": offset}
    assert shifted.execute(q).fetchone() == (window[0], n)
    notes = json.loads(shifted.execute("SELECT notes FROM ingest_log WHERE format = 'serving_log'").fetchone()[0])
    assert notes["alignment"]["applied_offset_ns"] == offset


@pytest.mark.parametrize(
    "where, name, fmt",
    [
        ("sample", "cpu_two_threads.json.gz", "kineto"),
        ("sample", "chromium_startup.json.gz", "chrome_json"),
        ("sample", "ncu_tiles_repeated_heavy.csv", "ncu_csv"),
        ("sample", "numerics_tf32.csv", "numerics_report"),
        ("sample", "runtime_demo.events.jsonl", "runtime_events"),
        ("sample", "chromium_startup.pftrace.gz", "perfetto_proto"),
        ("corpus", "pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "nsys_sqlite"),
        ("corpus", "pipit__nbody-nvtx__trace.csv", "nsys_stats_csv"),
        ("corpus", "pftx__example.pftrace", "perfetto_proto"),
        ("corpus", "energyllm__vllm_server.log", "serving_log"),
        ("data", "otlp_requests.jsonl", "otlp_json"),
        ("data", "vllm_benchmark_serving.json", "bench_serving"),
    ],
)
def test_formats_are_recognised_by_content_under_any_name(where, name, fmt, tmp_path):
    import shutil

    from tests.conftest import ROOT, corpus
    from tracekit import db

    source = {"sample": sample, "corpus": corpus, "data": lambda n: ROOT / "tests" / "data" / "serving" / n}[where](
        name
    )
    renamed = tmp_path / "capture.dat"  # an extension that says nothing
    shutil.copyfile(source, renamed)
    con = db.connect(None)
    results = ingest(con, [renamed])
    assert [r.format for r in results] == [fmt]
    assert results[0].events_read == results[0].events_ingested + results[0].events_skipped
