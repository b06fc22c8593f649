"""Writes otlp_requests.jsonl with the OpenTelemetry Python SDK (not a tracekit dependency: run it in a
throwaway venv with opentelemetry-sdk and opentelemetry-exporter-otlp-proto-common installed).

The SDK's protobuf encoder gives the ExportTraceServiceRequest; protobuf's JSON mapping writes ids as
base64, so they are rewritten as hex, which is what OTLP/JSON (and the collector's file exporter) uses.
One line per export batch, as the file exporter writes. Three overlapping requests of an LLM server
(process.pid stated) and one span of a router service without process.pid.
"""

import base64
import json
import sys

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, set_span_in_context

T0 = 1_770_648_322_000_000_000
MS = 1_000_000


class Collect(SpanExporter):
    def __init__(self):
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def hexify(obj):
    if isinstance(obj, dict):
        return {
            k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and v else hexify(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [hexify(x) for x in obj]
    return obj


def provider(resource):
    sink = Collect()
    p = TracerProvider(resource=Resource.create(resource))
    p.add_span_processor(SimpleSpanProcessor(sink))
    return p, sink


server, server_sink = provider({"service.name": "llm-server", "process.pid": 24440})
router, router_sink = provider({"service.name": "router"})
tracer = server.get_tracer("tracekit.fixture")
for i, (start, prompt, out_tokens) in enumerate([(0, 7, 8), (40, 24316, 120), (55, 22733, 80)]):
    root = tracer.start_span(
        "POST /v1/chat/completions",
        kind=SpanKind.SERVER,
        start_time=T0 + start * MS,
        attributes={
            "http.method": "POST",
            "gen_ai.usage.input_tokens": prompt,
            "gen_ai.usage.output_tokens": out_tokens,
            "llm.stream": i % 2 == 0,
            "llm.temperature": 0.6,
            "llm.stop": ["</s>", "\n\n"],
        },
    )
    ctx = set_span_in_context(root)
    t = start + 1
    for name, dur in (("tokenize", 1), ("prefill", 3 + prompt // 2000), ("decode", out_tokens // 4)):
        child = tracer.start_span(name, context=ctx, start_time=T0 + t * MS)
        child.end(end_time=T0 + (t + dur) * MS)
        t += dur
    root.end(end_time=T0 + (t + 1) * MS)
rspan = router.get_tracer("tracekit.fixture").start_span("route", kind=SpanKind.CLIENT, start_time=T0)
rspan.end(end_time=T0 + 2 * MS)

lines = []
for sink in (server_sink, router_sink):
    request = encode_spans(sink.spans)
    lines.append(json.dumps(hexify(MessageToDict(request, use_integers_for_enums=True)), separators=(",", ":")))
open(sys.argv[1] if len(sys.argv) > 1 else "otlp_requests.jsonl", "w").write("\n".join(lines) + "\n")
