"""Findings -> feedback records an agent acts on: ranked, deduplicated, within a token budget.

- Rank: severity, then score = share of the window the problem costs x the rule's confidence, then
  rule and id (so equal records keep one order across runs).
- Deduplicate: findings with the same rule and *cause key* (the location without run, rank, device,
  process, OS thread id and time window, names keyed as in finding ids: one cause seen on every rank
  or every run) become one record
  with a count, the summed cost and the worst examples.
- Budget: a record costs `estimate_tokens(json)` = ceil(characters of its compact JSON / 4), a
  deterministic stand-in for a tokenizer (English and JSON average 3.5-4.5 characters per token).
  Records are added in rank order in compact form (no evidence SQL, one example, no `what` texts)
  while the document stays within the budget; then, in rank order, each gets its full form back while
  the budget allows. What was left out is counted (`records_omitted`), never silently dropped.
- Drill down: every record names its worst finding (`drill_down.finding_id`: the `get_finding` tool,
  or the finding in `tracekit analyze --format json`) and the evidence SQL that recomputes it.
- Prose: deterministic by default. `llm_prose` asks a model to rewrite only the `prose` field; every
  number it writes must be one the record holds (in its own unit or converted), otherwise the
  deterministic prose stays and the record says why.
"""

from __future__ import annotations

import json
import math
import re

from tracekit.findings.model import SEVERITY_RANK, location_key
from tracekit.units import duration

FEEDBACK_VERSION = "1.0"
TOKEN_METHOD = "ceil(len(compact JSON) / 4)"
MAX_EXAMPLES = 3
# where a cause lives; run, rank, device, pid, tid and window name *an occurrence* of it
_CAUSE_KEYS = ("stream", "thread_name", "kernel", "op", "input_shapes", "code_path", "launch", "step")


def estimate_tokens(value) -> int:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return math.ceil(len(text) / 4)


def cause_key(finding: dict) -> str:
    where = location_key(finding.get("locality", {}), _CAUSE_KEYS)
    if isinstance(where.get("launch"), dict):
        where["launch"] = where["launch"].get("call") or where["launch"]
    return json.dumps([finding["rule"], where], sort_keys=True, default=str)


def _share(f: dict) -> float:
    return float(f["impact"]["share_of_window"] or 0.0)


def _score(f: dict) -> float:
    return round(_share(f) * float(f["confidence"]), 4)


def _order(f: dict):
    return (-SEVERITY_RANK[f["severity"]], -_score(f), f["rule"], f["id"])


def _where(loc: dict) -> dict:
    out = {k: v for k, v in loc.items() if k not in ("window_ns", "run_label") and v is not None}
    if isinstance(out.get("code_path"), list):
        out["code_path"] = out["code_path"][:3]
    return out


def deterministic_prose(rec: dict) -> str:
    share = 100 * rec["impact"]["worst_share_of_window"]
    text = f"{rec['title']}. Costs {duration(rec['impact']['time_ns'] or 0)}"
    text += f" ({share:.1f}% of its window at worst)" if rec["count"] > 1 else f" ({share:.1f}% of its window)"
    if rec["count"] > 1:
        text += f"; seen {rec['count']} times (runs/ranks/threads), worst example first"
    status = rec.get("status")
    if status:
        text += f"; versus the baseline: {status['status']}" + (f" ({status['trend']})" if status.get("trend") else "")
    return text + "."


def build_records(findings: list[dict], statuses: dict[str, dict] | None = None) -> list[dict]:
    """One record per (rule, cause key), ranked; `statuses` maps finding id -> finding_status entry."""
    groups: dict[str, list[dict]] = {}
    for f in sorted(findings, key=_order):
        groups.setdefault(cause_key(f), []).append(f)
    records = []
    for members in groups.values():
        worst = members[0]
        by_cost = sorted(members, key=lambda f: (-f["impact"]["time_ns"], f["id"]))
        rec = {
            "record_id": worst["id"],
            "rule": worst["rule"],
            "severity": worst["severity"],
            "confidence": worst["confidence"],
            "score": _score(worst),
            "title": worst["title"],
            "count": len(members),
            "impact": {
                "time_ns": int(sum(f["impact"]["time_ns"] for f in members)),
                "worst_share_of_window": max(_share(f) for f in members),
            },
            "where": _where(worst["locality"]),
            "observed": worst["observed"],
            "expected": worst["expected"],
            "hypothesis": worst["hypothesis"],
            "next_experiment": worst["next_experiment"],
            "acceptance": worst["acceptance"],
            # a single occurrence is the record itself: its example does not repeat the location
            "examples": [
                {
                    "finding_id": f["id"],
                    "time_ns": f["impact"]["time_ns"],
                    "share_of_window": _share(f),
                    **({"where": _where(f["locality"])} if len(members) > 1 else {}),
                }
                for f in by_cost[:MAX_EXAMPLES]
            ],
            "drill_down": {
                "finding_id": worst["id"],
                "tool": "get_finding",
                "evidence_sql": worst["evidence"]["sql"],
                "params": worst["evidence"]["params"],
            },
        }
        if statuses:
            rec["status"] = _group_status([statuses[f["id"]] for f in members if f["id"] in statuses])
            if rec["status"] is None:
                rec.pop("status")
        rec["prose"] = deterministic_prose(rec)
        rec["prose_source"] = "deterministic"
        records.append(rec)
    records.sort(key=lambda r: (-SEVERITY_RANK[r["severity"]], -r["score"], r["rule"], r["record_id"]))
    for i, r in enumerate(records, 1):
        r["rank"] = i
    return records


def _group_status(entries: list[dict]) -> dict | None:
    if not entries:
        return None
    kinds = [e["status"] for e in entries]
    # the most pressing status of the group: what an agent should look at first
    for kind in ("regressed", "new", "improved", "unchanged", "not_comparable"):
        if kind in kinds:
            worst = next(e for e in entries if e["status"] == kind)
            return {"status": kind, "trend": worst.get("trend"), "reason": worst["reason"]}
    return None


def compact(rec: dict) -> dict:
    """The same record without the evidence SQL and with one example: the handle still drills down."""
    out = dict(rec)
    out["drill_down"] = {k: v for k, v in rec["drill_down"].items() if k != "evidence_sql"}
    out["examples"] = rec["examples"][:1]
    out["observed"] = {k: v for k, v in rec["observed"].items() if k != "what"}
    out["expected"] = {k: v for k, v in rec["expected"].items() if k != "what"}
    out["compact"] = True
    return out


def build_feedback(findings: list[dict], budget_tokens: int | None = None, status_doc: dict | None = None) -> dict:
    """The feedback document; `status_doc` (finding_status.classify) adds per-record status and the fixed ids."""
    statuses = {e["finding_id"]: e for e in status_doc["findings"]} if status_doc else None
    records = build_records(findings, statuses)
    doc = {
        "feedback_version": FEEDBACK_VERSION,
        "budget_tokens": budget_tokens,
        "token_estimate_method": TOKEN_METHOD,
        "tokens_estimate": 0,
        "findings_total": len(findings),
        "records_total": len(records),
        "records_shown": 0,
        "records_omitted": 0,
        "records": [],
    }
    if status_doc:
        doc["status_summary"] = {k: status_doc[k] for k in ("counts", "tolerance", "tolerance_source")}
        doc["fixed"] = [
            {k: e[k] for k in ("finding_id", "rule", "title")} for e in status_doc["findings"] if e["status"] == "fixed"
        ]
    if budget_tokens is None:
        shown = records
    else:
        # coverage first: as many records as fit in compact form, in rank order; then each, in rank
        # order, gets its full form (evidence SQL, examples) back while the budget allows
        shown = []
        for rec in records:
            if estimate_tokens({**doc, "records": [*shown, compact(rec)]}) + 8 > budget_tokens:
                break
            shown.append(compact(rec))
        for i in range(len(shown)):
            trial = [*shown[:i], records[i], *shown[i + 1 :]]
            if estimate_tokens({**doc, "records": trial}) + 8 <= budget_tokens:
                shown = trial
    doc["records"] = shown
    doc["records_shown"] = len(shown)
    doc["records_omitted"] = len(records) - len(shown)
    if doc["records_omitted"]:
        doc["note"] = (
            f"{doc['records_omitted']} lower-ranked record(s) left out to stay within {budget_tokens} tokens; "
            "raise --budget-tokens or drill down by finding id"
        )
    _settle_estimate(doc)
    return doc


def _settle_estimate(doc: dict) -> None:
    """tokens_estimate counts the document including its own digits (hence the allowance of 8 above)."""
    for _ in range(4):
        value = estimate_tokens(doc)
        if doc["tokens_estimate"] == value:
            return
        doc["tokens_estimate"] = value


# ----------------------------------------------------------------------------------------- --llm


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:\.\d+)?")


def allowed_numbers(rec: dict) -> list[float]:
    """Numbers the prose may quote: those in the record, and its ns/shares in ms, us, s and percent."""
    values: list[float] = []

    def walk(v, key=""):
        if isinstance(v, bool):
            return
        if isinstance(v, (int, float)):
            values.append(float(v))
            if key.endswith("ns") or key in ("time_ns", "value"):
                values.extend([v / 1e3, v / 1e6, v / 1e9])
            if "share" in key or key in ("confidence", "score"):
                values.append(100 * v)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, str):
            values.extend(float(m.replace(",", "")) for m in _NUMBER.findall(v) if _parses(m))

    walk({k: v for k, v in rec.items() if k not in ("prose", "prose_source")})
    return values


def _parses(text: str) -> bool:
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def check_prose(prose: str, rec: dict) -> str | None:
    """None when every number in `prose` is a rounding of one the record holds; else the first that is not."""
    allowed = allowed_numbers(rec)
    for m in _NUMBER.findall(prose):
        if not _parses(m):
            continue
        x = float(m.replace(",", ""))
        decimals = len(m.split(".")[1]) if "." in m else 0
        tolerance = 0.5 * 10**-decimals + 1e-9
        if not any(abs(abs(x) - abs(v)) <= max(tolerance, 1e-9 * abs(v)) for v in allowed):
            return m
    return None


LLM_SYSTEM = (
    "You write one or two sentences of plain prose per performance feedback record for an engineer or agent "
    "tuning an inference stack. Use only facts and numbers present in the record; do not invent numbers. "
    'Answer with one JSON object: {"prose": {"<record_id>": "<text>", ...}}.'
)


def llm_prose(doc: dict, client, model: str) -> dict:
    """Replace each record's prose by the model's, when every number it quotes checks out."""
    from tracekit.findings.fence import SYSTEM_RULE, fence

    records = doc["records"]
    if not records:
        return doc
    view = [{k: v for k, v in r.items() if k not in ("prose", "prose_source", "drill_down")} for r in records]
    try:
        resp = client.chat.completions.create(
            model=model,
            messages=[
                {"role": "system", "content": LLM_SYSTEM + " " + SYSTEM_RULE},
                {"role": "user", "content": fence(view, "feedback records")},
            ],
        )
        answer = _json_object(resp.choices[0].message.content or "")
        proposals = answer.get("prose", {}) if isinstance(answer, dict) else {}
    except Exception as e:  # a provider error must not lose the deterministic feedback
        doc["llm_note"] = f"model call failed ({' '.join(str(e).split())[:200]}); deterministic prose kept"
        return doc
    for r in records:
        text = proposals.get(r["record_id"])
        if not isinstance(text, str) or not text.strip():
            r["prose_source"] = "deterministic (model wrote no prose for this record)"
            continue
        bad = check_prose(text, r)
        if bad is None:
            r["prose"], r["prose_source"] = text.strip(), "llm"
        else:
            r["prose_source"] = f"deterministic (model prose rejected: number {bad} is not in the record)"
    _settle_estimate(doc)
    # longer prose must not break the budget: the lowest-ranked model prose goes back to deterministic
    for r in reversed(records):
        if not doc["budget_tokens"] or doc["tokens_estimate"] <= doc["budget_tokens"]:
            break
        if r["prose_source"] == "llm":
            r["prose"] = deterministic_prose(r)
            r["prose_source"] = "deterministic (model prose did not fit the token budget)"
            _settle_estimate(doc)
    return doc


def _json_object(text: str):
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return {}
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return {}


# ------------------------------------------------------------------------------------------ text


def to_text(doc: dict) -> str:
    lines = [
        f"tracekit feedback: {doc['records_shown']} of {doc['records_total']} record(s) from "
        f"{doc['findings_total']} finding(s), ~{doc['tokens_estimate']} tokens"
        + (f" (budget {doc['budget_tokens']})" if doc["budget_tokens"] else "")
    ]
    for r in doc["records"]:
        status = f" [{r['status']['status']}]" if r.get("status") else ""
        lines.append(f"{r['rank']}. {r['severity'].upper()} {r['rule']}{status} {r['record_id']}: {r['prose']}")
        if r.get("count", 1) > 1:
            lines.append(f"   {r['count']} occurrences; worst: " + ", ".join(e["finding_id"] for e in r["examples"]))
    for f in doc.get("fixed", []):
        lines.append(f"fixed: {f['finding_id']} {f['rule']}: {f['title']}")
    if doc.get("note"):
        lines.append(doc["note"])
    return "\n".join(lines) + "\n"
