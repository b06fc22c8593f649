"""Vendor reports that only their own tool reads (.nsys-rep, .qdrep, .ncu-rep): exported by that tool
to a format tracekit reads when it is on PATH, else one line saying how to export them."""

from __future__ import annotations

import shutil
from pathlib import Path

from tracekit import tempfiles
from tracekit.errors import InputError

NATIVE_SUFFIXES = (".nsys-rep", ".qdrep", ".ncu-rep")


def _tool(path: Path) -> str:
    return "ncu" if path.name.lower().endswith(".ncu-rep") else "nsys"


def is_native(path: Path) -> bool:
    """A vendor's binary report (by its suffix: the format is the tool's own)."""
    return Path(path).name.lower().endswith(NATIVE_SUFFIXES)


def check_tool(path: Path) -> None:
    """InputError saying how to export a native report whose tool is not on PATH."""
    path = Path(path)
    if shutil.which(_tool(path)):
        return
    if _tool(path) == "ncu":
        raise InputError(path, "file", f"an Nsight Compute report: export it with `ncu --import {path} --csv "
                                       f"--page raw > {path.stem}.csv` and pass the .csv")  # fmt: skip
    how = f"nsys export --type sqlite --output {path.stem}.sqlite {path}"
    raise InputError(path, "file", f"an Nsight Systems report: nsys is not on PATH here; export it with `{how}`"
                                   " and pass the .sqlite")  # fmt: skip


def export_native(path: Path, tmpdir: str | None = None) -> Path:
    """A .nsys-rep exported to SQLite, a .ncu-rep to raw-page CSV, by the vendor tool on PATH."""
    import subprocess
    import tempfile

    check_tool(path)
    folder = Path(tempfile.mkdtemp(prefix=tempfiles.prefix() + "export-", dir=tmpdir))
    if _tool(path) == "ncu":
        out = folder / (path.stem + ".csv")
        command = ["ncu", "--import", str(path), "--csv", "--page", "raw"]
        with open(out, "w") as sink:
            proc = subprocess.run(command, stdout=sink, stderr=subprocess.PIPE, text=True)
    else:
        out = folder / (path.stem + ".sqlite")
        command = ["nsys", "export", "--type", "sqlite", "--output", str(out), str(path)]
        proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists() or not out.stat().st_size:
        shutil.rmtree(folder, ignore_errors=True)
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise InputError(path, "file", f"expected `{' '.join(command[:4])} ...` to export it ({last[0]})")
    return out
