"""Cut the `traceEvents` array out of a Chrome-trace JSON file (plain or compressed) into array files.

DuckDB reads a JSON *object* only as one value (a 1 GB Kineto file then costs 30-50 s and ~7 GB),
and it reads one JSON *array* file on one thread. So the array is sliced out by byte offsets, at
event boundaries, into parts of ~PART_TARGET bytes that DuckDB reads in parallel: in-kernel
(copy_file_range) for plain files, while decompressing for compressed ones (tracekit.compression). Only the bytes around each cut are
parsed here; everything else is left to DuckDB.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tracekit import compression, tempfiles
from tracekit.errors import InputError
from tracekit.parsers import json_array
from tracekit.parsers.json_array import KEY, array_end, find_array_start, first_char, parse_head, split_tail

CHUNK = 4 << 20
PART_TARGET = 4 << 20


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


def _temp_file(tmpdir: str | None) -> tuple[int, Path]:
    fd, name = tempfile.mkstemp(prefix=tempfiles.prefix(), suffix=".json", dir=tmpdir)
    return fd, Path(name)


def stage(path: Path, tmpdir: str | None = None) -> Staged:
    path = Path(path)
    if not path.exists():
        raise InputError(path, "open", "file not found")
    if path.is_dir():
        raise InputError(path, "open", "expected a trace file, got a directory")
    if compression.kind(path) is None:
        return _stage_plain(path, tmpdir)
    return _stage_stream(path, tmpdir)


def _stage_plain(path: Path, tmpdir: str | None) -> Staged:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(CHUNK)
        kind = first_char(head)
        meta: dict = {}
        if kind == b"[":  # JSON Array Format
            start = head.index(b"[")
            tail_off = max(start, size - json_array.TAIL_KEEP)  # from the '[' on when it is short: '[' alone is empty
            f.seek(tail_off)
            stop, exact = array_end(f.read(), path, tail_off)
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
                found = find_array_start(buf, path)
                if found is not None:
                    start = offset + found
                    break
                if len(buf) < CHUNK:
                    break
                offset += CHUNK - 64  # overlap, so a key split across chunks is still seen
            if start is None:
                raise InputError(path, f"byte {size}", 'expected a "traceEvents" array in the trace object')
            f.seek(0)
            meta = parse_head(f.read(start).rsplit(KEY, 1)[0], path)
            tail_off = max(start + 1, size - json_array.TAIL_KEEP)
            f.seek(tail_off)
            close, tail_meta = split_tail(f.read(), path, tail_off)
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


def _stage_stream(path: Path, tmpdir: str | None) -> Staged:
    """Decompress, writing the array from its '[' on into parts cut at event boundaries."""
    parts: list[Path] = []
    offsets: list[int] = []
    fd = -1
    head = b""
    part_written = 0  # bytes in the current part
    array_start = None
    tail = b""
    total_out = 0
    keep = json_array.TAIL_KEEP

    def new_part(prefix: bytes, source_offset: int) -> None:
        nonlocal fd, part_written, tail
        if fd >= 0:
            os.write(fd, b"]")
            os.close(fd)
        fd, out = _temp_file(tmpdir)
        parts.append(out)
        offsets.append(source_offset)
        os.write(fd, prefix)
        part_written, tail = len(prefix), prefix[-keep:]

    try:
        # b"" marks the end: a document under 64 bytes is still waiting in head then, for one more pass
        for data in itertools.chain(compression.chunks(path, CHUNK // 4), [b""]):  # ~4-8x that decompressed
            at_end = not data
            if at_end and (array_start is not None or not head):
                break
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
                    found = find_array_start(head, path)
                    if found is None:
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
            tail = (tail + data)[-keep:]
        if array_start is None:
            if first_char(head) == b"{":
                raise InputError(path, f"byte {total_out}", 'expected a "traceEvents" array in the trace object')
            raise InputError(path, "byte 0", "expected a JSON object or array (a Chrome/Kineto trace)")
        meta = {}
        tail_off = total_out - len(tail)
        if first_char(head) == b"{":
            meta = parse_head(head.rsplit(KEY, 1)[0], path)
            close, tail_meta = split_tail(tail, path, tail_off)
            meta.update(tail_meta)
            os.ftruncate(fd, part_written - len(tail) + close + 1)
        else:
            # the closing ']' is rewritten: the array may lack it, or end in a trailing comma
            stop, _ = array_end(tail, path, tail_off)
            keep_bytes = part_written - len(tail) + stop
            os.ftruncate(fd, keep_bytes)
            os.lseek(fd, keep_bytes, os.SEEK_SET)
            os.write(fd, b"]")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Staged(path, parts).cleanup()
        raise
    os.close(fd)
    return Staged(path, parts, meta, total_out, part_offsets=offsets, compressed=True)
