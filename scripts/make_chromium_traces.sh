#!/usr/bin/env bash
# Make sample_traces/chromium_startup.pftrace.gz: a real Perfetto protobuf trace written by Chromium's
# startup tracing (TrackEvent with thread/process track descriptors, interned names/categories, per-sequence
# incremental state and incremental clocks, flows, counter tracks, legacy events).
#
# Workload: headless Chromium loads a small data: page that runs a short JavaScript loop and prints the DOM;
# trace categories below, the first 2 s of the browser's life. A fresh profile dir each run.
#
# Usage: scripts/make_chromium_traces.sh [OUT_DIR]   (default: sample_traces; needs /usr/bin/chromium)
set -euo pipefail

out_dir="${1:-$(dirname "$0")/../sample_traces}"
chromium="${CHROMIUM:-/usr/bin/chromium}"
categories="toplevel,toplevel.flow,mojom,base,benchmark,blink,loading,v8,ipc,cc,gpu"
page='data:text/html,<h1>hi</h1><script>for(let i=0;i<1e5;i++){}</script>'

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --no-sandbox: containers without user namespaces; --disable-gpu: no display. Exit status of chromium is
# ignored (dbus warnings); the trace file is checked instead.
timeout 120 "$chromium" --headless=new --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$work/profile" \
    --trace-startup="$categories" --trace-startup-format=proto \
    --trace-startup-file="$work/trace.pftrace" --trace-startup-duration=2 \
    --dump-dom "$page" >/dev/null 2>"$work/chromium.log" || true

if [ ! -s "$work/trace.pftrace" ]; then
    echo "chromium wrote no trace; its log:" >&2
    tail -20 "$work/chromium.log" >&2
    exit 1
fi
gzip -9 -n -c "$work/trace.pftrace" >"$out_dir/chromium_startup.pftrace.gz"
"$chromium" --version
echo "categories: $categories"
ls -l "$out_dir/chromium_startup.pftrace.gz"
