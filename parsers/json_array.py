"""Where the `traceEvents` array of a Chrome-trace JSON document starts and ends, from a few bytes.

A trace is a JSON object (`{"schemaVersion": 1, ..., "traceEvents": [...], ...}`, metadata on either
side of the array) or the JSON Array Format (`[{...}, {...}]`, which may lack its closing `]`). Only
the bytes around the array's ends are parsed: the staging of the events for DuckDB
(parsers/json_slice.py) and the annotated copy of a trace (tracekit/render/annotate.py) both stream
everything in between untouched.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tracekit.errors import InputError

KEY = b'"traceEvents"'
WS = b" \t\r\n"
TAIL_KEEP = 1 << 20  # bytes at the end that hold the array's close: metadata after it (traceName, INFO...) is small


def first_char(head: bytes) -> bytes:
    """The first byte of the document after whitespace and a UTF-8 byte order mark (b"" if none)."""
    stripped = head.lstrip(WS + b"\xef\xbb\xbf")
    return stripped[:1]


def find_array_start(buf: bytes, path: Path) -> int | None:
    """Offset of the '[' that opens the traceEvents array, or None if not in buf yet."""
    pos = buf.find(KEY)
    while pos != -1:
        i = pos + len(KEY)
        while i < len(buf) and buf[i] in WS:
            i += 1
        if i < len(buf) and buf[i : i + 1] == b":":
            i += 1
            while i < len(buf) and buf[i] in WS:
                i += 1
            if i >= len(buf):
                return None
            if buf[i : i + 1] != b"[":
                raise InputError(path, f"byte {i}", 'expected "traceEvents" to be an array')
            return i
        pos = buf.find(KEY, pos + 1)
    return None


def parse_head(head: bytes, path: Path) -> dict:
    """Metadata keys before traceEvents: `{"schemaVersion": 1, ..., ` -> dict."""
    text = head.rstrip(WS)
    if text.endswith(b","):
        text = text[:-1]
    try:
        obj = orjson.loads(text + b"}")
    except orjson.JSONDecodeError as e:
        raise InputError(path, f"byte {e.pos}", f"malformed JSON before traceEvents ({e.msg})") from None
    return obj if isinstance(obj, dict) else {}


def split_tail(tail: bytes, path: Path, tail_offset: int) -> tuple[int, dict]:
    """Find the ']' closing traceEvents in the last bytes of the document.

    Returns (offset of ']' in tail, metadata after the array). A candidate ']' is right when what
    follows it parses as the rest of the top-level object, so ']' inside later strings are skipped.
    """
    end = tail.rstrip(WS)
    if not end.endswith(b"}"):
        raise InputError(
            path, f"byte {tail_offset + len(end)}", "expected '}' closing the trace object (file truncated?)"
        )
    # Events are objects, so the array's ']' follows a '}' (or '[' when empty); later metadata such as
    # Kineto's "INFO" list of strings also ends in ']', hence the stricter pass first.
    for allowed in ((b"}", b"["), None):
        pos = len(end)
        while True:
            pos = end.rfind(b"]", 0, pos)
            if pos == -1:
                break
            before = end[:pos].rstrip(WS)[-1:]
            if (allowed and before not in allowed) or before in (b",", b":"):
                continue
            rest = end[pos + 1 :].lstrip(WS)
            if rest == b"}":
                return pos, {}
            if rest.startswith(b","):
                try:
                    obj = orjson.loads(b"{" + rest[1:])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(obj, dict):
                    return pos, obj
    raise InputError(
        path, f"byte {tail_offset + len(end)}", "expected ']' closing the traceEvents array (file truncated?)"
    )


def array_end(tail: bytes, path: Path, tail_offset: int) -> tuple[int, bool]:
    """Where the events of a JSON Array Format trace stop, from the array's last bytes.

    Returns (offset in tail just past the last event, whether the array is exactly closed). The
    format lets a writer stop without the closing ']' (a trace cut at the end of a write) and leave
    a trailing comma, so both are accepted; a document cut inside an event is reported here when it
    visibly ends mid-value, else by the JSON reader with its position.
    """
    body = tail.rstrip(WS)
    closed = body.endswith(b"]")
    if closed:
        body = body[:-1].rstrip(WS)
    comma = body.endswith(b",")
    if comma:
        body = body[:-1].rstrip(WS)
    if not closed and not body.endswith((b"}", b"[")):
        raise InputError(
            path,
            f"byte {tail_offset + len(tail.rstrip(WS))}",
            "expected a complete event, ',' or ']' at the end of the event array (file truncated inside an event?)",
        )
    return len(body), closed and not comma
