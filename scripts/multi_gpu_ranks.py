"""What the multi-GPU trace scripts share: NVLink multicast off, one process a rank, and how a run is
described in its cells.json.

Import it before torch: the environment it sets is read when NCCL and torch load.
"""

from __future__ import annotations

import os
import platform
import time

# NVLink multicast stays off on these hosts: a program using it can take their GPUs out of service
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def join_rank(torch, dist, rank: int, world: int, backend: str, port: int):
    """Join the process group as `rank` (one GPU a rank with nccl, one CPU thread with gloo); returns
    the rank's device."""
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return device


def provenance(torch, backend: str, world: int, command: str, cpu: str, **extra) -> dict:
    """How the traces were made: the command, versions, devices and the NCCL setting that matters."""
    gpu = backend == "nccl"
    return dict(
        command=command,
        torch_version=torch.__version__,
        nccl_version=".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
        python_version=platform.python_version(),
        device=(f"{world}x {torch.cuda.get_device_name(0)}" if gpu else f"CPU only: {cpu}"),
        backend=f"{backend}, one process a rank, one host; NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}",
        **extra,
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
