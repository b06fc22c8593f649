"""Cut the `traceEvents` array out of a Chrome-trace JSON file (plain or gzip) into array files.

DuckDB reads a JSON *object* only as one value (a 1 GB Kineto file then costs 30-50 s and ~7 GB),
and it reads one JSON *array* file on one thread. So the array is sliced out by byte offsets, at
event boundaries, into parts of ~PART_TARGET bytes that DuckDB reads in parallel: in-kernel
(copy_file_range) for plain files, while decompressing for gzip. Only the bytes around each cut are
parsed here; everything else is left to DuckDB.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tracekit.errors import InputError

CHUNK = 4 << 20
PART_TARGET = 4 << 20
TAIL_KEEP = 1 << 20  # metadata after the array (traceName, INFO, distributedInfo...) is small
KEY = b'"traceEvents"'
WS = b" \t\r\n"


@dataclass
class Staged:
    """An events array split into JSON array files (in order), plus the trace's top-level metadata."""

    source: Path
    parts: list[Path]
    metadata: dict = field(default_factory=dict)
    bytes_read: int = 0
    is_temp: bool = True
    # the source byte each part file's first byte stands for (its '[' when the array's own, else one
    # before the events it holds), so an offset inside a part maps back by a plain addition
    part_offsets: list[int] = field(default_factory=list)
    compressed: bool = False

    def cleanup(self) -> None:
        if not self.is_temp:
            return
        for part in self.parts:
            try:
                os.unlink(part)
            except FileNotFoundError:
                pass

    def locate(self, part_name: str) -> int | None:
        """Source byte offset of the part a DuckDB error names."""
        for part, offset in zip(self.parts, self.part_offsets):
            if part.name in part_name:
                return offset
        return None


# A top-level event starts after '},' in the array; the candidate is confirmed by decoding one whole
# object there that looks like an event and is followed by ',' or ']'. A wrong cut cannot pass
# silently: both sides would stop being valid JSON and DuckDB would say so.
_BOUNDARY = re.compile(rb"\}\s*,\s*(\{)\s*\"")
_DECODER = json.JSONDecoder()


def find_boundary(buf: bytes, start: int = 0) -> tuple[int, int] | None:
    """(end of the previous event, start of the next) for the first event boundary at or after start."""
    for m in _BOUNDARY.finditer(buf, start):
        brace = m.start(1)
        window = buf[brace : brace + (1 << 16)].decode("utf-8", "ignore")
        try:
            obj, end = _DECODER.raw_decode(window)
        except ValueError:
            continue
        after = window[end:].lstrip()[:1]
        if isinstance(obj, dict) and "ph" in obj and after in (",", "]"):
            return m.start() + 1, brace
    return None


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def first_char(head: bytes) -> bytes:
    stripped = head.lstrip(WS + b"\xef\xbb\xbf")
    return stripped[:1]


def _find_array_start(buf: bytes, path: Path) -> int | None:
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


def _parse_head(head: bytes, path: Path) -> dict:
    """Metadata keys before traceEvents: `{"schemaVersion": 1, ..., ` -> dict."""
    text = head.rstrip(WS)
    if text.endswith(b","):
        text = text[:-1]
    try:
        obj = orjson.loads(text + b"}")
    except orjson.JSONDecodeError as e:
        raise InputError(path, f"byte {e.pos}", f"malformed JSON before traceEvents ({e.msg})") from None
    return obj if isinstance(obj, dict) else {}


def _split_tail(tail: bytes, path: Path, tail_offset: int) -> tuple[int, dict]:
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


def _array_end(tail: bytes, path: Path, tail_offset: int) -> tuple[int, bool]:
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


def _temp_file(tmpdir: str | None) -> tuple[int, Path]:
    fd, name = tempfile.mkstemp(prefix="tracekit-", suffix=".json", dir=tmpdir)
    return fd, Path(name)


def stage(path: Path, tmpdir: str | None = None) -> Staged:
    path = Path(path)
    if not path.exists():
        raise InputError(path, "open", "file not found")
    if path.is_dir():
        raise InputError(path, "open", "expected a trace file, got a directory")
    if is_gzip(path):
        return _stage_gzip(path, tmpdir)
    return _stage_plain(path, tmpdir)


def _stage_plain(path: Path, tmpdir: str | None) -> Staged:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(CHUNK)
        kind = first_char(head)
        meta: dict = {}
        if kind == b"[":  # JSON Array Format
            start = head.index(b"[")
            tail_off = max(start, size - TAIL_KEEP)  # from the '[' on when it is short: '[' alone is empty
            f.seek(tail_off)
            stop, exact = _array_end(f.read(), path, tail_off)
            end = tail_off + stop
            if exact and size < 2 * PART_TARGET:
                return Staged(path, [path], {}, size, is_temp=False, part_offsets=[0])
        elif kind != b"{":
            raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
        else:
            start = None
            offset = 0
            while offset < size:
                f.seek(offset)
                buf = f.read(CHUNK)
                found = _find_array_start(buf, path)
                if found is not None:
                    start = offset + found
                    break
                if len(buf) < CHUNK:
                    break
                offset += CHUNK - 64  # overlap, so a key split across chunks is still seen
            if start is None:
                raise InputError(path, f"byte {size}", 'expected a "traceEvents" array in the trace object')
            f.seek(0)
            meta = _parse_head(f.read(start).rsplit(KEY, 1)[0], path)
            tail_off = max(start + 1, size - TAIL_KEEP)
            f.seek(tail_off)
            close, tail_meta = _split_tail(f.read(), path, tail_off)
            end = tail_off + close
            meta.update(tail_meta)
        cuts = _plan_cuts(f, start, end)
    parts = [_temp_file(tmpdir) for _ in cuts]
    src = os.open(path, os.O_RDONLY)

    def write_part(i: int) -> None:
        fd, (lo, hi) = parts[i][0], cuts[i]
        try:
            os.write(fd, b"[")
            _copy_range(src, fd, lo, hi - lo)
            os.write(fd, b"]")
        finally:
            os.close(fd)

    try:
        # copy_file_range runs in the kernel without the GIL: two threads copy twice as fast
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(write_part, range(len(cuts))))
    except BaseException:
        Staged(path, [p for _, p in parts]).cleanup()
        raise
    finally:
        os.close(src)
    offsets = [lo - 1 for lo, _ in cuts]
    parts = [p for _, p in parts]
    return Staged(path, parts, meta, size, part_offsets=offsets)


def _plan_cuts(f, start: int, end: int) -> list[tuple[int, int]]:
    """[lo, hi) byte ranges of events, between the array's '[' at start and its ']' at end."""
    n = max(1, (end - start) // PART_TARGET)
    cuts, lo = [], start + 1
    for k in range(1, n):
        target = start + k * (end - start) // n
        if target <= lo:
            continue
        f.seek(target)
        found = find_boundary(f.read(CHUNK))
        if found is None or target + found[1] >= end:
            continue
        cuts.append((lo, target + found[0]))
        lo = target + found[1]
    cuts.append((lo, end))
    return cuts


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    try:
        while count > 0:
            n = os.copy_file_range(src, dst, count, offset)
            if n == 0:
                break
            offset, count = offset + n, count - n
    except OSError:  # filesystems without copy_file_range (across devices, some overlays)
        os.lseek(src, offset, os.SEEK_SET)
        while count > 0:
            data = os.read(src, min(CHUNK, count))
            if not data:
                break
            os.write(dst, data)
            count -= len(data)


def _stage_gzip(path: Path, tmpdir: str | None) -> Staged:
    """Decompress, writing the array from its '[' on into parts cut at event boundaries."""
    dec = zlib.decompressobj(wbits=31)
    parts: list[Path] = []
    offsets: list[int] = []
    fd = -1
    head = b""
    part_written = 0  # bytes in the current part
    array_start = None
    tail = b""
    total_out = 0
    compressed_read = 0

    def new_part(prefix: bytes, source_offset: int) -> None:
        nonlocal fd, part_written, tail
        if fd >= 0:
            os.write(fd, b"]")
            os.close(fd)
        fd, out = _temp_file(tmpdir)
        parts.append(out)
        offsets.append(source_offset)
        os.write(fd, prefix)
        part_written, tail = len(prefix), prefix[-TAIL_KEEP:]

    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(CHUNK // 4)  # ~4-8x that once decompressed
                # a document under 64 bytes is still waiting in head at the end: one more pass for it
                at_end = not chunk
                if at_end and (array_start is not None or not head):
                    break
                compressed_read += len(chunk)
                try:
                    data = dec.decompress(chunk)
                    while dec.eof and dec.unused_data:  # concatenated gzip members
                        rest = dec.unused_data
                        dec = zlib.decompressobj(wbits=31)
                        data += dec.decompress(rest)
                except zlib.error as e:
                    raise InputError(path, f"compressed byte {compressed_read}", f"valid gzip data ({e})") from None
                data_offset = total_out  # source offset of data[0]
                total_out += len(data)
                if array_start is None:
                    head += data
                    if len(head) < 64 and not at_end:
                        continue
                    kind = first_char(head[:CHUNK])
                    if kind == b"[":
                        found = head.index(b"[")
                    elif kind != b"{":
                        raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
                    else:
                        found = _find_array_start(head, path)
                        if found is None:
                            if at_end:
                                break
                            continue
                    array_start = found
                    data, data_offset, head = head[found:], found, head[:found]
                    new_part(b"", found)
                while len(data) > PART_TARGET - part_written:
                    cut = find_boundary(data, max(0, PART_TARGET - part_written))
                    if cut is None:
                        break
                    os.write(fd, data[: cut[0]])
                    new_part(b"[", data_offset + cut[1] - 1)
                    data, data_offset = data[cut[1] :], data_offset + cut[1]
                os.write(fd, data)
                part_written += len(data)
                tail = (tail + data)[-TAIL_KEEP:]
                if at_end:
                    break
        if not dec.eof:
            raise InputError(path, f"compressed byte {compressed_read}", "gzip stream ends early (truncated file)")
        if array_start is None:
            if first_char(head) == b"{":
                raise InputError(path, f"byte {total_out}", 'expected a "traceEvents" array in the trace object')
            raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
        meta = {}
        tail_off = total_out - len(tail)
        if first_char(head) == b"{":
            meta = _parse_head(head.rsplit(KEY, 1)[0], path)
            close, tail_meta = _split_tail(tail, path, tail_off)
            meta.update(tail_meta)
            os.ftruncate(fd, part_written - len(tail) + close + 1)
        else:
            # the closing ']' is rewritten: the array may lack it, or end in a trailing comma
            stop, _ = _array_end(tail, path, tail_off)
            keep = part_written - len(tail) + stop
            os.ftruncate(fd, keep)
            os.lseek(fd, keep, os.SEEK_SET)
            os.write(fd, b"]")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Staged(path, parts).cleanup()
        raise
    os.close(fd)
    return Staged(path, parts, meta, total_out, part_offsets=offsets, compressed=True)
