"""Cut the `traceEvents` array out of a Chrome-trace JSON file (plain or gzip) into a file of its own.

DuckDB reads a JSON *array* in parallel chunks with bounded memory, but a JSON *object* only as one
value (a 1 GB Kineto file then costs 30-50 s and ~7 GB). So the array is sliced out by byte offsets:
in-kernel (copy_file_range) for plain files, while decompressing for gzip. Only the bytes around the
cut are parsed here; everything else is left to DuckDB.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tracekit.errors import InputError

CHUNK = 4 << 20
TAIL_KEEP = 1 << 20  # metadata after the array (traceName, INFO, distributedInfo...) is small
KEY = b'"traceEvents"'
WS = b" \t\r\n"


@dataclass
class Staged:
    """An events array ready for DuckDB, plus the trace's top-level metadata."""

    source: Path
    array_path: Path
    metadata: dict = field(default_factory=dict)
    bytes_read: int = 0
    is_temp: bool = True
    array_offset: int = 0  # where the array starts in the (decompressed) source, for error positions

    def cleanup(self) -> None:
        if self.is_temp:
            try:
                os.unlink(self.array_path)
            except FileNotFoundError:
                pass


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
    pos = len(end)
    while True:
        pos = end.rfind(b"]", 0, pos)
        if pos == -1:
            raise InputError(
                path, f"byte {tail_offset + len(end)}", "expected ']' closing the traceEvents array (file truncated?)"
            )
        rest = end[pos + 1 :].lstrip(WS)
        before = end[:pos].rstrip(WS)[-1:]
        if before not in (b"}", b"[", b""):
            continue
        if rest == b"}":
            return pos, {}
        if rest.startswith(b","):
            try:
                obj = orjson.loads(b"{" + rest[1:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return pos, obj


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
        if kind == b"[":  # JSON Array Format: DuckDB reads the file itself
            return Staged(path, path, {}, size, is_temp=False)
        if kind != b"{":
            raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
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
        tail = f.read()
    close, tail_meta = _split_tail(tail, path, tail_off)
    end = tail_off + close + 1
    meta.update(tail_meta)
    fd, out = _temp_file(tmpdir)
    try:
        src = os.open(path, os.O_RDONLY)
        try:
            _copy_range(src, fd, start, end - start)
        finally:
            os.close(src)
    finally:
        os.close(fd)
    return Staged(path, out, meta, size, array_offset=start)


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
    """Decompress, writing only from the array's '[' on; trim the tail once the stream ends."""
    dec = zlib.decompressobj(wbits=31)
    fd, out = _temp_file(tmpdir)
    head = b""
    written = 0
    array_start = None
    tail = b""
    total_out = 0
    compressed_read = 0
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
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
                total_out += len(data)
                if array_start is None:
                    head += data
                    if len(head) < 64 and total_out < 64:
                        continue
                    kind = first_char(head[:CHUNK])
                    if kind == b"[":
                        array_start = 0
                        data, head = head, b""
                    elif kind != b"{":
                        raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
                    else:
                        found = _find_array_start(head, path)
                        if found is None:
                            continue
                        array_start = found
                        data, head = head[found:], head[:found]
                os.write(fd, data)
                written += len(data)
                tail = (tail + data)[-TAIL_KEEP:]
        if not dec.eof:
            raise InputError(path, f"compressed byte {compressed_read}", "gzip stream ends early (truncated file)")
        if array_start is None:
            if first_char(head) == b"{":
                raise InputError(path, f"byte {total_out}", 'expected a "traceEvents" array in the trace object')
            raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
        meta = {}
        if head:  # object form
            meta = _parse_head(head.rsplit(KEY, 1)[0], path)
            tail_off = array_start + written - len(tail)
            close, tail_meta = _split_tail(tail, path, tail_off)
            meta.update(tail_meta)
            os.ftruncate(fd, written - len(tail) + close + 1)
    except BaseException:
        os.close(fd)
        os.unlink(out)
        raise
    os.close(fd)
    return Staged(path, out, meta, total_out, array_offset=array_start)
