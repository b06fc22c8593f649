"""What to say about a file that no reader takes: native reports that need exporting first, and
content that matches no supported format (one line naming what was tried)."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

from tracekit.errors import InputError

TRIED = (
    "Chrome/Kineto trace JSON (object or array)",
    "Nsight Systems SQLite export",
    "nsys stats CSV trace report",
    "Nsight Compute CSV",
    "numerics report",
    "runtime-event JSONL",
    "Perfetto protobuf",
    "OTLP/JSON spans",
    "serving benchmark JSON",
    "SGLang/vLLM server log",
)


def _head(path: Path, size: int = 4096) -> bytes:
    with open(path, "rb") as f:
        head = f.read(size)
    if head[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, size)
        except zlib.error:
            return b""
    return head


def check_known(path: Path) -> None:
    """Raise one clear InputError for a file the Chrome/Kineto reader would be handed in vain."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".nsys-rep") or name.endswith(".qdrep"):
        how = f"nsys export --type sqlite --output {path.stem}.sqlite {path}"
        if shutil.which("nsys"):
            return  # converted by export_native before ingest
        raise InputError(path, "file", f"an Nsight Systems report: nsys is not on PATH here; export it with `{how}`"
                                       " and pass the .sqlite")  # fmt: skip
    if name.endswith(".ncu-rep"):
        if shutil.which("ncu"):
            return  # converted by export_native before ingest
        raise InputError(path, "file", f"an Nsight Compute report: export it with `ncu --import {path} --csv "
                                       f"--page raw > {path.stem}.csv` and pass the .csv")  # fmt: skip
    try:
        head = _head(path)
    except OSError:
        return  # a missing file is reported by the reader, with its name
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:
        return  # empty: the reader says what it expected
    if stripped[:1] not in (b"{", b"["):
        raise InputError(path, "byte 0", "not a format tracekit reads; tried by content: " + ", ".join(TRIED))


NATIVE_SUFFIXES = (".nsys-rep", ".qdrep", ".ncu-rep")


def is_native(path: Path) -> bool:
    """A vendor's binary report whose own tool (on PATH) can export it to a format tracekit reads."""
    name = Path(path).name.lower()
    tool = "ncu" if name.endswith(".ncu-rep") else "nsys"
    return name.endswith(NATIVE_SUFFIXES) and shutil.which(tool) is not None


def export_native(path: Path, tmpdir: str | None = None) -> Path:
    """A .nsys-rep exported to SQLite, a .ncu-rep to raw-page CSV, by the vendor tool on PATH."""
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="tracekit-export-", dir=tmpdir))
    if path.name.lower().endswith(".ncu-rep"):
        out = folder / (path.stem + ".csv")
        command = ["ncu", "--import", str(path), "--csv", "--page", "raw"]
        with open(out, "w") as sink:
            proc = subprocess.run(command, stdout=sink, stderr=subprocess.PIPE, text=True)
    else:
        out = folder / (path.stem + ".sqlite")
        command = ["nsys", "export", "--type", "sqlite", "--output", str(out), str(path)]
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists() or not out.stat().st_size:
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise InputError(path, "file", f"expected `{' '.join(command[:4])} ...` to export it ({last[0]})")
    return out
