"""OpenTelemetry OTLP/JSON spans (the collector's file exporter: one ExportTraceServiceRequest per line)
-> complete events of kind `span`.

Each line is `{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"scope": {...},
"spans": [...]}]}]}`. A span has hex `traceId`/`spanId`/`parentSpanId`, `name`, `kind`,
`startTimeUnixNano`/`endTimeUnixNano` (decimal strings, or numbers) and typed KeyValue attributes
(`stringValue`, `intValue` as a string, `doubleValue`, `boolValue`, `bytesValue`, `arrayValue`,
`kvlistValue`). Mapping: ts_ns = start (epoch ns), dur_ns = end - start; pid = resource attribute
`process.pid`, else a stable id per `service.name` (first 6 bytes of its SHA-256); tid = the same
per service (one thread per service: spans have no thread); track = `otlp/<traceId>`, so the
spans of one trace (one request) nest among themselves by time and never under another trace's.
args = the span's attributes flattened (`a.b` keys as written, arrays and maps as JSON values) plus
`trace_id`, `span_id`, `parent_span_id`, `span_kind`, `service.name`, `scope`, `status_code`;
resource attributes go to runs.metadata.resources. Events and links inside a span stay in `extra`.

Each span is an item read; a line that is not JSON or not an object, a span without start/end
times, with end before start or with no name is skipped per reason, never fatal.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import orjson

from tracekit import compression
from tracekit.parsers.rows import Export

FORMAT = "otlp_json"
DESCRIPTION = "OTLP/JSON spans"
ATTACHABLE = True
KIND = "span"
SNIFF_BYTES = 1 << 16
FIRST_KEY = re.compile(rb'\s*\{\s*"resourceSpans"\s*:')
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def sniff(head: bytes, name: str, **_) -> bool:
    """A JSON object whose first key is `resourceSpans` (one per line, or one pretty-printed)."""
    # a first line longer than the sample is still recognised by its leading key
    return bool(FIRST_KEY.match(head[:SNIFF_BYTES]))


def _value(v):
    """An OTLP AnyValue as a plain JSON value."""
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return v["intValue"]
    if "arrayValue" in v:
        return [_value(x) for x in _list(_object(v["arrayValue"]).get("values"))]
    if "kvlistValue" in v:
        return _attrs(_object(v["kvlistValue"]).get("values"))
    return None


def _list(value) -> list:
    """A repeated field of the request; one of another JSON type holds nothing."""
    return value if isinstance(value, list) else []


def _object(value) -> dict:
    return value if isinstance(value, dict) else {}


def _attrs(items) -> dict:
    out = {}
    for kv in _list(items):
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _value(kv.get("value"))
    return out


def _nanos(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _synthetic_pid(service: str) -> int:
    return int.from_bytes(hashlib.sha256(service.encode()).digest()[:6], "big")


def read(path: Path, **_) -> Export:
    path = Path(path)
    data = compression.read_bytes(path)
    out = Export(source=path, format=FORMAT, bytes_read=len(data))
    resources = {}
    lines = data.split(b"\n")
    if lines and lines[0].strip() in (b"{", b""):
        try:  # one pretty-printed request (the spec's examples) rather than one per line
            lines = [orjson.dumps(orjson.loads(data))]
        except orjson.JSONDecodeError:
            pass
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.read["line"] += 1
            out.skipped["malformed JSON line"] += 1
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("resourceSpans"), list):
            out.read["line"] += 1
            out.skipped["line without resourceSpans"] += 1
            continue
        for rs in obj["resourceSpans"]:
            if not isinstance(rs, dict):
                out.read["line"] += 1
                out.skipped["resourceSpans item not an object"] += 1
                continue
            res = _attrs(_object(rs.get("resource")).get("attributes"))
            service = str(res.get("service.name", "unknown_service"))
            pid = _nanos(res.get("process.pid"))
            pid = pid if pid is not None else _synthetic_pid(service)
            resources[f"{service}/{pid}"] = res
            for ss in _list(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans")):
                ss = _object(ss)
                scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
                for span in _list(ss.get("spans")):
                    out.read["span"] += 1
                    row = _span(span, pid, service, scope, line_no, out)
                    if row:
                        out.rows.append(row)
    out.notes = {
        "clock": "epoch ns (startTimeUnixNano), as the spans state them",
        "unit": "one span",
        "kind": KIND,
        "track": "otlp/<traceId>: the spans of one trace nest among themselves",
    }
    out.metadata = {"resources": resources}
    return out


def _span(span, pid, service, scope, line_no, out):
    if not isinstance(span, dict):
        out.skipped["span not an object"] += 1
        return None
    start, end = _nanos(span.get("startTimeUnixNano")), _nanos(span.get("endTimeUnixNano"))
    if start is None or end is None:
        out.skipped["span without start or end time"] += 1
        return None
    if end < start:
        out.skipped["span with end before start"] += 1
        return None
    name = span.get("name")
    if not isinstance(name, str) or not name:
        out.skipped["span without a name"] += 1
        return None
    trace_id = str(span.get("traceId") or "").lower()
    args = _attrs(span.get("attributes"))
    kind = span.get("kind")
    args.update({
        "trace_id": trace_id,
        "span_id": str(span.get("spanId") or "").lower(),
        "parent_span_id": str(span.get("parentSpanId") or "").lower() or None,
        "span_kind": SPAN_KINDS.get(kind, kind) if isinstance(kind, int) else kind,
        "service.name": service,
        "scope": scope.get("name") if isinstance(scope, dict) else None,
        "status_code": (span.get("status") or {}).get("code") if isinstance(span.get("status"), dict) else None,
    })  # fmt: skip
    extra = {"line": line_no}
    for key in ("events", "links"):
        if span.get(key):
            extra[key] = span[key]
    return (KIND, "X", "otlp", name, start, end - start, pid, pid, f"otlp/{trace_id}", None, None, None, None,
            None, orjson.dumps(args).decode(), orjson.dumps(extra).decode())  # fmt: skip
