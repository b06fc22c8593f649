"""A file's content digest, so that the same file ingested twice into one database is recognised."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Files up to this size are hashed whole; larger ones by their size, their first and last WHOLE_BYTES
# and SAMPLES blocks spread between: two profiler outputs of one size that agree on 16 MiB spread over
# the file are the same file in practice, and hashing a 1 GB trace whole would cost a second read.
WHOLE_BYTES = 8 << 20
SAMPLES = 32
SAMPLE_BYTES = 256 << 10


def content_digest(path: str | Path) -> str:
    """`sha256:<hex>` of the whole file, or `sampled-sha256:<hex>` (see above) of a large one; of a
    folder read as one input, `folder-sha256:<hex>` over its files' paths and digests."""
    if os.path.isdir(path):
        h = hashlib.sha256()
        for here, _, names in sorted(os.walk(path)):
            for name in sorted(names):
                file = Path(here) / name
                h.update(f"{file.relative_to(path).as_posix()}\0{content_digest(file)}\n".encode())
        return "folder-sha256:" + h.hexdigest()
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 2 * WHOLE_BYTES:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return "sha256:" + h.hexdigest()
        h.update(f.read(WHOLE_BYTES))
        span = size - 2 * WHOLE_BYTES - SAMPLE_BYTES
        for i in range(SAMPLES):
            f.seek(WHOLE_BYTES + span * i // max(1, SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
        f.seek(size - WHOLE_BYTES)
        h.update(f.read(WHOLE_BYTES))
    return "sampled-sha256:" + h.hexdigest()
