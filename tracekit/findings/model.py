"""The finding record: what a rule reports, versioned, with its JSON Schema shipped in the package.

A finding is local (locality), cheap (next_experiment), verifiable (evidence.sql recomputes
observed; acceptance names the check that shows a fix worked). Its id hashes the rule and the
location only, never timings, so the same problem keeps its id across runs and fixes can be tracked;
names in the location are keyed first (`location_key`), so per-run ids inside them do not move it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources

from tracekit.db.names import name_key

FINDING_SCHEMA_VERSION = "1.1"
SEVERITIES = ("info", "warning", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

# Keys a locality may carry; anything else is a programming error in a rule.
LOCALITY_KEYS = (
    "run_id",
    "run_label",
    "rank",
    "link",
    "pid",
    "tid",
    "thread_name",
    "device",
    "stream",
    "kernel",
    "op",
    "input_shapes",
    "code_path",
    "window_ns",
    "launch",
    "step",
)


@dataclass
class Quantity:
    value: float | int | None
    unit: str
    what: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v != ""}


@dataclass
class Finding:
    rule: str
    severity: str
    confidence: float
    title: str
    locality: dict
    observed: Quantity
    expected: Quantity
    impact_ns: int
    window_ns: int
    sql: str
    hypothesis: str
    next_experiment: str
    acceptance: str
    sample_event_ids: list[int] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    sql_params: dict = field(default_factory=dict)
    id: str = ""

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        unknown = set(self.locality) - set(LOCALITY_KEYS)
        if unknown:
            raise ValueError(f"unknown locality keys: {sorted(unknown)}")
        if not self.id:
            self.id = finding_id(self.rule, self.locality)

    @property
    def impact_share(self) -> float:
        return round(self.impact_ns / self.window_ns, 4) if self.window_ns else 0.0

    def as_dict(self) -> dict:
        return {
            "schema_version": FINDING_SCHEMA_VERSION,
            "id": self.id,
            "rule": self.rule,
            "severity": self.severity,
            "confidence": round(self.confidence, 2),
            "title": self.title,
            "locality": {k: v for k, v in self.locality.items() if v is not None},
            "observed": self.observed.as_dict(),
            "expected": self.expected.as_dict(),
            "impact": {
                "time_ns": int(self.impact_ns),
                "share_of_window": self.impact_share,
                "window_ns": self.window_ns,
            },
            "evidence": {
                "sql": self.sql.strip(),
                "params": self.sql_params,
                "sample_event_ids": [int(i) for i in self.sample_event_ids],
                **({"details": self.extra} if self.extra else {}),
            },
            "hypothesis": self.hypothesis,
            "next_experiment": self.next_experiment,
            "acceptance": self.acceptance,
            "caveats": list(self.caveats),
        }


# Locality keys that describe *where*, used for the stable id. Windows and step numbers move from run
# to run; labels and run ids name the file, not the problem.
_ID_KEYS = (
    "rank",
    "link",
    "device",
    "stream",
    "thread_name",
    "kernel",
    "op",
    "input_shapes",
    "code_path",
    "launch",
    "step",
)
# Kineto names threads "thread 4830 (kv_transfer)": the OS thread id changes every run, the name does not.
_OS_TID = re.compile(r"\bthread \d+\s*")
# Host-side names: annotations, ops, frames and step names may carry per-run ids. Kernel names come from
# compiled code and are the same in every run; shapes and launch configurations are values, not names.
_NAMED_KEYS = ("op", "step")


def location_key(locality: dict, keys: tuple[str, ...]) -> dict:
    """The locality's `keys` as they identify a place across runs: the thread name without its OS
    thread id, and host-side names (op, step, each code-path frame) by `name_key`."""
    where = {k: locality[k] for k in keys if locality.get(k) is not None}
    if "thread_name" in where:
        where["thread_name"] = _OS_TID.sub("", str(where["thread_name"]))
    for k in _NAMED_KEYS:
        if isinstance(where.get(k), str):
            where[k] = name_key(where[k])
    if isinstance(where.get("code_path"), list):
        where["code_path"] = [name_key(frame) if isinstance(frame, str) else frame for frame in where["code_path"]]
    return where


def finding_id(rule: str, locality: dict) -> str:
    where = location_key(locality, _ID_KEYS)
    digest = hashlib.sha256(json.dumps([rule, where], sort_keys=True, default=str).encode()).hexdigest()
    return f"{rule}-{digest[:12]}"


def json_schema() -> dict:
    text = resources.files("tracekit.findings").joinpath("finding.schema.json").read_text()
    return json.loads(text)
