"""tracekit annotate on real traces: original events untouched, one slice per finding window on the
trace's own clock, and the annotated file ingests back with exact reconciliation."""

from __future__ import annotations

import functools
import gzip
import hashlib

import orjson
import pytest
from click.testing import CliRunner

from tracekit import db
from tracekit.cli.app import cli
from tracekit.engine.runner import run_rules
from tracekit.findings.report import build_report
from tracekit.findings.time_summary import top_costs
from tracekit.ingest.pipeline import ingest
from tracekit.render.annotate import TRACK_NAME, copy_with_events, ns_to_us_text

from .conftest import corpus, sample

EAGER = sample("gpu_prefill_decode_eager.json.gz")


@functools.cache
def _read(path):
    """The parsed trace; cached, so treat it as read-only."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = orjson.loads(data)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def _digest(events) -> str:
    h = hashlib.sha256()
    for e in events:
        h.update(orjson.dumps(e, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


@functools.cache
def _findings(path):
    """Every finding of the trace, computed here independently of the command."""
    con = db.connect(None)
    ingest(con, [path])
    findings, notes = run_rules(con)
    report = build_report(con, findings, notes, top_costs(con), max_findings=len(findings))
    base = con.execute("SELECT coalesce(base_time_ns, 0) FROM runs").fetchone()[0]
    con.close()
    return report["findings"], base


def _annotate(src, out):
    res = CliRunner().invoke(cli, ["annotate", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def eager_annotated(tmp_path_factory):
    out = tmp_path_factory.mktemp("annotate") / "eager.annotated.json.gz"
    _annotate(EAGER, out)
    return out


def test_original_events_unchanged_and_track_added(eager_annotated):
    original = _read(EAGER)
    annotated = _read(eager_annotated)
    n = len(original["traceEvents"])
    assert _digest(annotated["traceEvents"][:n]) == _digest(original["traceEvents"])
    # top-level metadata (deviceProperties, baseTimeNanoseconds, ...) survives too
    assert {k: v for k, v in annotated.items() if k != "traceEvents"} == {
        k: v for k, v in original.items() if k != "traceEvents"
    }
    added = annotated["traceEvents"][n:]
    pids = {e["pid"] for e in added}
    assert len(pids) == 1
    pid = pids.pop()
    assert pid not in {e.get("pid") for e in original["traceEvents"]}
    meta = [e for e in added if e["ph"] == "M"]
    assert {"name": TRACK_NAME} in [e["args"] for e in meta if e["name"] == "process_name"]
    lanes = {e["tid"] for e in added if e["ph"] == "X"}
    named = {e["tid"] for e in meta if e["name"] == "thread_name"}
    assert lanes == named and lanes
    # slices of one lane never overlap (a viewer would cut them)
    for lane in lanes:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in added if e["ph"] == "X" and e["tid"] == lane)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))


def test_one_slice_per_finding_window_on_the_trace_clock(eager_annotated):
    findings, base = _findings(EAGER)
    windowed = {f["id"]: f["locality"]["window_ns"] for f in findings if f["locality"].get("window_ns")}
    assert windowed, "the eager trace has findings with windows"
    added = [e for e in _read(eager_annotated)["traceEvents"] if e.get("cat") == "tracekit"]
    assert sorted(e["args"]["id"] for e in added) == sorted(windowed)
    for e in added:
        lo, hi = windowed[e["args"]["id"]]
        # float view (what a viewer sees): within a ns of the window
        assert abs(e["ts"] * 1000 + base - lo) < 1000 and abs(e["dur"] * 1000 - (hi - lo)) < 1
        f = e["args"]["finding"]
        assert (
            e["args"]["next_experiment"] == f["next_experiment"] and e["args"]["evidence_sql"] == f["evidence"]["sql"]
        )
        assert e["args"]["severity"] in ("info", "warning", "critical")


def test_annotated_file_ingests_back_exactly(eager_annotated, fresh_db):
    res = ingest(fresh_db, [EAGER, eager_annotated])
    orig, ann = res
    added = len(_read(eager_annotated)["traceEvents"]) - len(_read(EAGER)["traceEvents"])
    assert ann.events_read == orig.events_read + added
    assert ann.events_skipped == orig.events_skipped == 0
    assert ann.events_read == ann.events_ingested + ann.events_skipped
    # exact times: the slices' ts_ns as tracekit reads them are the finding windows to the ns
    findings, _ = _findings(EAGER)
    windows = sorted(tuple(f["locality"]["window_ns"]) for f in findings if f["locality"].get("window_ns"))
    got = fresh_db.execute(
        "SELECT ts_ns, end_ns FROM events WHERE run_id = ? AND cat = 'tracekit' ORDER BY 1, 2", [ann.run_id]
    ).fetchall()
    assert sorted(got) == windows
    # every original event kind is there in the same number
    kinds = "SELECT kind, count(*) FROM events WHERE run_id = ? AND coalesce(cat, '') <> 'tracekit' GROUP BY 1"
    a = dict(fresh_db.execute(kinds, [orig.run_id]).fetchall())
    b = dict(fresh_db.execute(kinds, [ann.run_id]).fetchall())
    pid = _pid(eager_annotated)
    b["metadata"] -= sum(1 for e in _read(eager_annotated)["traceEvents"] if e["ph"] == "M" and e["pid"] == pid)
    assert a == b


def _pid(path):
    return next(e["pid"] for e in _read(path)["traceEvents"] if e.get("cat") == "tracekit")


def test_gz_output_is_the_original_text_plus_the_track(eager_annotated):
    assert eager_annotated.read_bytes()[:2] == b"\x1f\x8b"
    out = gzip.decompress(eager_annotated.read_bytes())
    # byte for byte: the original up to the array's last event, the new events, then the original's end
    src = gzip.decompress(EAGER.read_bytes())
    close = src.rstrip().rfind(b"]")
    assert out.startswith(src[:close].rstrip()) and out.endswith(src[close:])
    middle = out[len(src[:close].rstrip()) : len(out) - len(src[close:])]
    inserted = orjson.loads(b"[" + middle.strip().lstrip(b",") + b"]")
    assert inserted and {e["pid"] for e in inserted} == {_pid(eager_annotated)}


@pytest.mark.parametrize(
    "name", ["kineto__docs_traces__before_fix_trace.json", "hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"]
)  # fmt: skip
def test_corpus_traces(tmp_path, name):
    src = corpus(name)
    out = tmp_path / "out.json"
    _annotate(src, out)
    original, annotated = _read(src), _read(out)
    n = len(original["traceEvents"])
    assert _digest(annotated["traceEvents"][:n]) == _digest(original["traceEvents"])
    findings, _ = _findings(src)
    slices = [e for e in annotated["traceEvents"][n:] if e["ph"] == "X"]
    assert len(slices) == sum(1 for f in findings if f["locality"].get("window_ns"))
    con = db.connect(None)
    (r,) = ingest(con, [out])
    assert r.events_read == len(annotated["traceEvents"]) and r.events_read == r.events_ingested + r.events_skipped


def test_array_form_and_empty_array(tmp_path):
    extra = [b'{"ph":"X","cat":"tracekit","name":"x","pid":9,"tid":1,"ts":1.5,"dur":2}']
    src = tmp_path / "a.json"
    src.write_bytes(b'[{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"dur":1}]\n')
    out = tmp_path / "b.json"
    copy_with_events(src, out, extra)
    assert [e["name"] for e in orjson.loads(out.read_bytes())] == ["a", "x"]
    # the JSON Array Format may stop without ']' or after a trailing ','
    for text in (b'[{"ph":"X","name":"a","args":{"l":[1]},"pid":1,"tid":1,"ts":1,"dur":1},\n', b"[\n"):
        src.write_bytes(text)
        copy_with_events(src, out, extra)
        assert [e["name"] for e in orjson.loads(out.read_bytes())] == (["a", "x"] if b"a" in text else ["x"])
    src.write_bytes(b'{"traceEvents": [ ], "traceName": "t]"}')
    copy_with_events(src, out, extra)
    doc = orjson.loads(out.read_bytes())
    assert [e["name"] for e in doc["traceEvents"]] == ["x"] and doc["traceName"] == "t]"


def test_exact_microsecond_text():
    assert ns_to_us_text(5156821333678131) == "5156821333678.131"
    assert ns_to_us_text(2000) == "2" and ns_to_us_text(-1500) == "-1.500" and ns_to_us_text(7) == "0.007"


def test_non_chrome_input_is_written_from_the_database(tmp_path):
    src = corpus("pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    out = tmp_path / "nsys.json.gz"
    _annotate(src, out)
    con = db.connect(None)
    (orig,) = ingest(con, [src])
    doc = _read(out)
    added = [e for e in doc["traceEvents"] if e.get("pid") == _pid(out)]
    assert len(doc["traceEvents"]) == orig.events_ingested + len(added)
    (again,) = ingest(con, [out])
    assert again.events_read == again.events_ingested == len(doc["traceEvents"])
    same = "SELECT kind, count(*), sum(dur_ns) FROM events WHERE run_id = ? AND coalesce(cat, '') <> 'tracekit' AND kind <> 'metadata' GROUP BY 1"
    assert dict((k, (n, d)) for k, n, d in con.execute(same, [orig.run_id]).fetchall()) == dict(
        (k, (n, d)) for k, n, d in con.execute(same, [again.run_id]).fetchall()
    )


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X"')
    for args in (
        ["annotate", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o.json")],
        ["annotate", str(bad), "-o", str(tmp_path / "o.json")],
        ["annotate", str(EAGER), "-o", str(tmp_path / "o.txt")],
        ["annotate", str(EAGER), "-o", str(tmp_path / "o.json"), "--rules", "no-such-rule"],
    ):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not list(tmp_path.glob("o.*"))


def test_streaming_in_small_chunks_gives_the_same_file(tmp_path, monkeypatch):
    """Samples fit in one read; force many chunks and a short held-back tail to exercise the streaming."""
    import tracekit.parsers.json_array as json_array
    import tracekit.render.annotate as annotate_mod

    extra = [b'{"ph":"X","cat":"tracekit","name":"x","pid":9,"tid":1,"ts":1.5,"dur":2}']
    big = tmp_path / "big.json"
    copy_with_events(EAGER, big, extra)
    monkeypatch.setattr(annotate_mod, "CHUNK", 1 << 16)
    monkeypatch.setattr(json_array, "TAIL_KEEP", 5000)
    small = tmp_path / "small.json"
    copy_with_events(EAGER, small, extra)
    assert small.read_bytes() == big.read_bytes()
    assert big.read_bytes().replace(b",\n" + extra[0] + b"\n", b"") == gzip.decompress(EAGER.read_bytes())
