#!/usr/bin/env bash
# Real generic Chrome trace JSON (not Kineto) for tests/test_chrome_json.py:
#   sample_traces/chromium_startup.json.gz: headless Chromium start-up, JSON Object Format written by
#     Chromium's own exporter: X slices, B slices still open when the capture stops, async b/e/n with
#     id2.local and plain id, flow v1 s/f with bp, R marks, I instants (s t), M metadata.
#   sample_traces/node_trace_events.json.gz: Node.js --trace-event-categories, written by V8's
#     tracing controller: B/E pairs (fs.sync, GC), async b/e with plain ids (async_hooks), I, M.
# The categories are chosen to keep the files small (< 1 MB gzip). Run from the repository root.
# Chromium keeps running after the capture is written, hence the timeout (exit 124 is expected).
set -euo pipefail

OUT=${OUT:-sample_traces}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

timeout 20 chromium --headless=new --no-sandbox --disable-gpu --user-data-dir="$WORK/profile" \
    --trace-startup=toplevel,benchmark,v8,blink --trace-startup-duration=2 \
    --trace-startup-format=json --trace-startup-file="$WORK/chromium_startup.json" about:blank \
    >"$WORK/chromium.log" 2>&1 || [ $? -eq 124 ]
test -s "$WORK/chromium_startup.json"
gzip -9 -n -c "$WORK/chromium_startup.json" >"$OUT/chromium_startup.json.gz"

cat >"$WORK/workload.js" <<'JS'
// a few sync and async fs calls, a timer and enough allocation for some minor GCs
const fs = require('fs');
let garbage = [];
for (let i = 0; i < 200000; i++) garbage.push({ i });
fs.statSync(__filename);
setTimeout(() => fs.readFile(__filename, () => { garbage = null; }), 10);
JS
(cd "$WORK" && node --trace-event-categories v8,node,node.async_hooks,node.bootstrap,node.fs.sync,node.fs.async \
    --trace-event-file-pattern "$WORK/node_trace.json" workload.js)
gzip -9 -n -c "$WORK/node_trace.json" >"$OUT/node_trace_events.json.gz"

ls -l "$OUT/chromium_startup.json.gz" "$OUT/node_trace_events.json.gz"
chromium --version
node --version
