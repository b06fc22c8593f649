"""What each input is: a folder expanded into its files, then every file opened once and recognised
by its content (a bounded, decompressed prefix; tracekit.parsers.recognise)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracekit import compression, parsers
from tracekit.errors import InputError


@dataclass
class Input:
    path: Path
    reader: object  # the reader module that reads it
    notes: dict = field(default_factory=dict)  # for its ingest_log row (the folder it came from)


def classify(path: Path, **options):
    """The reader of this file, by content; InputError naming what was tried when none takes it, or
    where its compressed data broke when that cut the content short."""
    head = _prefix(path)
    reader = parsers.recognise(head.data, path.name, **options)
    if reader is None:
        if head.broken is not None:
            raise head.broken
        tried = ", ".join(description for _, description in parsers.formats())
        raise InputError(path, "byte 0", f"not a format tracekit reads; tried by content: {tried}")
    return reader


def recognise(path: Path, fallback: bool = True, **options):
    """The reader of this file from one bounded read of its content, or None (parsers.recognise)."""
    return parsers.recognise(_prefix(path).data, path.name, fallback=fallback, **options)


def _prefix(path: Path) -> compression.Prefix:
    try:
        return compression.prefix(path, parsers.HEAD_BYTES)
    except OSError:
        # a missing or unreadable file: named by its suffix, else read as a trace, which says so
        return compression.Prefix(b"")


def _natural(path: Path) -> list:
    """rank2 before rank10: digit runs compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(path))]


def classify_all(paths: list[Path], pool, **options) -> dict:
    """The reader of each file (or the error classify raised for it), recognised on this thread and
    the one of `pool` (a ThreadPoolExecutor of one worker) at once: recognising a file is mostly
    inflating its first MiB, which releases the GIL (64 ranks of about 1 MB: 0.20 s on one thread,
    0.15 s on two). Without a pool, {}: expand recognises each file in its turn."""

    def one(path: Path):
        try:
            return classify(path, **options)
        except Exception as e:  # raised when its turn comes, as classify would have raised it then
            return e

    paths = list(dict.fromkeys(paths))
    if pool is None or len(paths) < 2:
        return {}
    beside = pool.map(one, paths[1::2])
    here = [one(path) for path in paths[::2]]
    known = dict(zip(paths[::2], here))
    known.update(zip(paths[1::2], beside))
    return known


def expand(paths: list[Path], known: dict | None = None, **options) -> list[Input]:
    """Every input, a folder (a profiler's output directory, e.g. tensorboard_trace_handler's, one file
    per rank or worker) replaced by the files in it that a reader takes, in natural name order; the
    others are skipped and named in the notes of those runs. A folder a reader claims as a whole
    (parsers.claim: one rank's profiler output, such as torch_npu's `*_ascend_pt`) is one input, at
    any depth, and its files are that reader's. A folder with none is an InputError. `known`: readers
    (or errors) of files classify_all recognised already."""
    out = []
    for path in map(Path, paths):
        if not path.is_dir():
            reader = known.pop(path) if known and path in known else classify(path, **options)
            if isinstance(reader, Exception):
                raise reader
            out.append(Input(path, reader))
            continue
        claimed = parsers.claim(path)
        if claimed is not None:
            out.append(Input(path, claimed, {"input": {"folder": str(path)}}))
            continue
        folders, files = _walk(path)
        taken = [(p, recognise(p, fallback=False, **options)) for p in files]
        taken += [(p, reader) for p, reader in folders]
        taken.sort(key=lambda item: _natural(item[0]))
        skipped = [str(p.relative_to(path)) for p, reader in taken if reader is None]
        if len(skipped) == len(taken):
            what = "it is empty" if not taken else f"no file in it is a format tracekit reads ({_names(skipped)})"
            raise InputError(path, "folder", f"expected trace files: {what}")
        note = {"folder": str(path)} | ({"skipped_in_folder": skipped} if skipped else {})
        out += [Input(p, reader, {"input": dict(note)}) for p, reader in taken if reader is not None]
    return out


def _walk(root: Path) -> tuple[list, list[Path]]:
    """The folders under `root` a reader claims, with their readers (not looked into further), and
    every other file under it; hidden ones left out."""
    folders, files = [], []
    for here, subdirs, names in os.walk(root):
        kept = []
        for name in sorted(subdirs):
            sub = Path(here) / name
            if name.startswith("."):
                continue
            reader = parsers.claim(sub)
            if reader is not None:
                folders.append((sub, reader))
            else:
                kept.append(name)
        subdirs[:] = kept
        files += [Path(here) / name for name in names if not name.startswith(".") and (Path(here) / name).is_file()]
    return folders, files


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
