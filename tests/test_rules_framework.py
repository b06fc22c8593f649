"""Rules are found by walking the package, one module per rule named after it, documented in the
fixed form, with every parameter (severity thresholds included) overridable."""

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_rule, sample
from tracekit.engine.registry import Param, Rule, all_rules, discover, get_rule, rules_of

REQUIRED_HEADINGS = ("## What it does", "## Why it matters", "## Example", "## Options")
TRACEKIT = str(Path(sys.executable).with_name("tracekit"))
RULE_SOURCE = '''
"""A rule dropped into the package."""
from tracekit.engine.registry import rule


@rule(code="{code}", name="{name}", title="t", category="test", requires=(), params={{}})
def check(con, params, ctx):
    return []
'''


def _write_rule(folder: Path, module: str, code: str, name: str) -> None:
    (folder / f"{module}.py").write_text(textwrap.dedent(RULE_SOURCE.format(code=code, name=name)))


def test_every_public_module_defines_one_rule_named_after_it():
    package = importlib.import_module("tracekit.rules")
    modules = sorted(m.name for m in pkgutil.iter_modules(package.__path__))
    public = [m for m in modules if not m.startswith("_")]
    for name in modules:
        found = rules_of(importlib.import_module(f"tracekit.rules.{name}"))
        if name.startswith("_"):
            assert found == [], f"{name}: shared modules define no rule"
        else:
            [only] = found
            assert name == only.name.replace("-", "_"), f"module {name} holds rule {only.code} {only.name}"
    assert sorted(r.module.rsplit(".", 1)[1] for r in all_rules()) == public


def test_a_module_dropped_into_the_package_is_found(tmp_path, monkeypatch):
    package = importlib.import_module("tracekit.rules")
    _write_rule(tmp_path, "dropped_in", "X900", "dropped-in")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    try:
        found = discover()
        assert found["X900"].module == "tracekit.rules.dropped_in" and found["X900"].name == "dropped-in"
        assert set(found) - {"X900"} == {r.code for r in all_rules()}
    finally:
        sys.modules.pop("tracekit.rules.dropped_in", None)


def test_two_modules_with_one_code_fail(tmp_path, monkeypatch):
    package = tmp_path / "duplicated_rules"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write_rule(package, "first", "X901", "first")
    _write_rule(package, "second", "X901", "second")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ValueError, match="X901.*duplicated_rules.first.*duplicated_rules.second"):
            discover("duplicated_rules")
    finally:
        for name in ("duplicated_rules", "duplicated_rules.first", "duplicated_rules.second"):
            sys.modules.pop(name, None)


def _documented_options(rule) -> dict[str, str]:
    """`- `name` (default): ...` bullets of the Options section, name -> the default as written ("" if none)."""
    options = rule.doc.split("## Options", 1)[1]
    return dict(re.findall(r"^- `([a-z0-9_]+)`(?: \(([^)]*)\))?", options, re.M))


def _same_default(written: str, default) -> bool:
    text = written.strip("`\"'")
    if isinstance(default, bool):
        return text.lower() == str(default).lower()
    if isinstance(default, (int, float)):
        return float(text) == default
    return text == default


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_doc_has_the_fixed_form_and_documents_exactly_its_options(rule):
    for heading in REQUIRED_HEADINGS:
        assert heading in rule.doc, f"{rule.code} doc lacks {heading}"
    documented = _documented_options(rule)
    assert set(documented) == set(rule.params), (
        f"{rule.code}: undocumented {sorted(set(rule.params) - set(documented))}, "
        f"not options {sorted(set(documented) - set(rule.params))}"
    )
    for name, written in documented.items():
        assert written, f"{rule.code}.{name}: the doc gives no default"
        assert _same_default(written, rule.params[name].default), f"{rule.code}.{name}: doc says {written}"
    assert re.fullmatch(r"[A-Z]+[0-9]{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    assert f"({rule.code} {rule.name})" in rule.doc.splitlines()[0]


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_every_rule_names_a_real_example_input(rule):
    assert rule.example and rule.example.inputs
    for name in rule.example.inputs:
        assert name.startswith("corpus/") or (ROOT / "sample_traces" / name).exists(), name
    assert set(rule.example.params) <= set(rule.params)
    assert bool(rule.example.params) <= bool(rule.example.note), "say why the defaults are not shown"


def test_lookup_by_code_or_name_and_param_override():
    first = all_rules()[0]
    assert get_rule(first.name) is get_rule(first.code.lower())
    name, param = next(iter(first.params.items()))
    resolved = first.resolve_params({name: str(param.default)})
    assert resolved[name] == param.default and type(resolved[name]) is type(param.default)
    with pytest.raises(KeyError):
        first.resolve_params({"no_such_option": 1})
    with pytest.raises(KeyError):
        get_rule("Z999")


def test_severity_follows_its_parameters_on_a_real_trace(eager):
    [default] = run_rule(eager, "G001")[0]
    share = default.extra["exposed_share"]
    assert default.severity == "critical" and share >= get_rule("G001").params["critical_share"].default
    [lower] = run_rule(eager, "G001", critical_share=round(share + 0.01, 4))[0]
    [lowest] = run_rule(eager, "G001", critical_share=1.0, warning_share=1.0)[0]
    assert (lower.severity, lowest.severity) == ("warning", "info")
    assert lower.id == lowest.id == default.id and lower.observed.value == default.observed.value
    [sync] = [f for f in run_rule(eager, "H001")[0] if f.locality["op"] == "aten::_local_scalar_dense"]
    assert sync.severity == "warning"
    [raised] = [
        f
        for f in run_rule(eager, "H001", critical_share=sync.impact_share)[0]
        if f.locality["op"] == "aten::_local_scalar_dense"
    ]
    assert raised.severity == "critical"


def test_fail_on_gates_on_severity_parameters():
    trace = str(sample("gpu_prefill_decode_eager.json.gz"))
    args = [TRACEKIT, "analyze", trace, "--rules", "G001", "--fail-on", "critical", "-f", "json"]
    gated = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert gated.returncode == 1, gated.stderr
    relaxed = subprocess.run([*args, "--param", "G001.critical_share=1.0"], capture_output=True, text=True, timeout=300)
    assert relaxed.returncode == 0, relaxed.stderr


def test_rules_doc_is_generated_and_current():
    import importlib.util

    script = ROOT / "scripts" / "gen_rule_docs.py"
    spec = importlib.util.spec_from_file_location("gen_rule_docs", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        rendered = mod.render()
    except mod.MissingInput as e:
        if os.environ.get("CI"):  # CI has the corpus: a missing example input is a broken checkout
            raise
        pytest.skip(str(e))
    assert mod.OUT.read_text() == rendered, "docs/rules.md is stale: run `make docs`"


def test_finding_id_ignores_timings_and_os_thread_ids():
    from tracekit.findings.model import finding_id

    a = finding_id(
        "H001", {"thread_name": "thread 4830 (kv_transfer)", "op": "aten::item", "window_ns": [1, 2], "run_id": 1}
    )
    b = finding_id(
        "H001", {"thread_name": "thread 977 (kv_transfer)", "op": "aten::item", "window_ns": [5, 9], "run_id": 3}
    )
    c = finding_id("H001", {"thread_name": "thread 977 (main)", "op": "aten::item"})
    assert a == b != c
    assert a.startswith("H001-") and len(a) == len("H001-") + 12


def test_bool_and_int_params_coerce_from_cli_text():
    r = Rule("X001", "x", "x", "x", (), {"flag": Param(False, ""), "n": Param(3, "")}, check=lambda *a: [])
    assert r.resolve_params({"flag": "false", "n": "4"}) == {"flag": False, "n": 4}
    assert r.resolve_params({"flag": "true"})["flag"] is True
    with pytest.raises(ValueError):
        r.resolve_params({"n": 0.5})
    with pytest.raises(ValueError):
        r.resolve_params({"flag": "maybe"})


def test_a_rule_whose_query_fails_becomes_a_data_quality_note(loaded, monkeypatch):
    from tracekit.engine.runner import run_rules
    from tracekit.rules import host_sync

    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    monkeypatch.setattr(host_sync, "SITES_SQL", "SELECT * FROM no_such_table")
    found, notes = run_rules(con, ["H001", "G001"])
    assert [n.rule for n in notes if "failed" in n.message] == ["H001"]
    assert {f.rule for f in found} == {"G001"}
