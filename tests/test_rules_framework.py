"""Every rule is registered, documented in the fixed form, and its parameters are overridable."""

import re

import pytest

from tracekit.engine.registry import RULE_MODULES, all_rules, discovered_modules, get_rule

REQUIRED_HEADINGS = ("## What it does", "## Why it matters", "## Example", "## Options")


def test_every_rule_module_is_registered():
    assert sorted(RULE_MODULES) == discovered_modules()
    assert len(all_rules()) == len(RULE_MODULES)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_doc_has_fixed_form_and_lists_every_option(rule):
    for heading in REQUIRED_HEADINGS:
        assert heading in rule.doc, f"{rule.code} doc lacks {heading}"
    options = rule.doc.split("## Options", 1)[1]
    documented = set(re.findall(r"`([a-z0-9_]+)`", options))
    assert set(rule.params) <= documented, f"{rule.code}: undocumented options {set(rule.params) - documented}"
    assert re.fullmatch(r"[A-Z]+[0-9]{3}", rule.code)
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", rule.name)


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


def test_rules_doc_is_generated_and_current():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_rule_docs.py"
    spec = importlib.util.spec_from_file_location("gen_rule_docs", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.OUT.read_text() == mod.render(), "docs/rules.md is stale: run `make docs`"


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
    from tracekit.engine.registry import Param, Rule

    r = Rule("X001", "x", "x", "x", (), {"flag": Param(False, ""), "n": Param(3, "")}, check=lambda *a: [])
    assert r.resolve_params({"flag": "false", "n": "4"}) == {"flag": False, "n": 4}
    assert r.resolve_params({"flag": "true"})["flag"] is True
    with pytest.raises(ValueError):
        r.resolve_params({"n": 0.5})
    with pytest.raises(ValueError):
        r.resolve_params({"flag": "maybe"})


def test_a_rule_whose_query_fails_becomes_a_data_quality_note(loaded, monkeypatch):
    from tests.conftest import sample
    from tracekit.engine.runner import run_rules
    from tracekit.rules import host_sync

    con = loaded(sample("gpu_prefill_decode_eager.json.gz"))
    monkeypatch.setattr(host_sync, "BLOCKING_CALLS_SQL", "SELECT * FROM no_such_table")
    monkeypatch.setattr(host_sync, "_blocking_sql", lambda: "SELECT * FROM no_such_table")
    found, notes = run_rules(con, ["H001", "G001"])
    assert [n.rule for n in notes if "failed" in n.message] == ["H001"]
    assert {f.rule for f in found} == {"G001"}
