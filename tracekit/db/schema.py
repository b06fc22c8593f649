"""Versions and kind names of the public SQL schema; the schema itself is the stdlib of SQL files in
tracekit/db/views/ (loaded by tracekit.db.stdlib, documented in docs/schema.md, which is generated from
those files).

Bump SCHEMA_VERSION whenever a public column or view changes meaning or disappears, and say so in
docs/schema_notes/changelog.md.
"""

SCHEMA_VERSION = "1.10"

# Kineto categories as written (lower-cased) -> normalized kind. Legacy 2020-2021 traces use
# capitalised names (Operator/Runtime/Kernel/Memcpy/Memset); ROCm keeps cuda_runtime for hip* calls.
CATEGORY_KINDS = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "python_function": "python_function",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_runtime": "cuda_runtime",
    "runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "memset": "gpu_memset",
    "cuda_sync": "cuda_sync",
    "cuda_event": "cuda_event",
    "trace": "profiler_span",
    "cpu_instant_event": "cpu_instant_event",
    "overhead": "overhead",
}

# Kinds whose pid/tid are a device and a stream, not an OS process and thread.
DEVICE_KINDS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "mtia_ccp_events",
)
