"""Where a model's query runs: a child process whose limits hold from outside the query.

DuckDB checks for an interrupt between chunks and counts only what its buffer manager allocates,
so one expression (`repeat('x', 2000000000)`, `unnest(range(100000000))`) can run past any timer
and any memory_limit. The query therefore runs in a worker process started with an address-space
limit (an allocation past it fails: DuckDB reports Out of Memory and the worker lives on), and the
caller kills the worker if it has not answered shortly after the deadline. Workers are kept between
queries (starting one costs an interpreter and `import duckdb`) and started afresh after a kill.

Messages are pickled frames over the worker's stdin and stdout, so it runs as
`python -m tracekit.agent.query_worker MEMORY_MB` whatever the caller's `__main__` is.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading

# Address space the worker holds besides the query's memory: DuckDB's code, its threads' stacks
# and its allocator's arenas reserve ~820 MB once a database is attached, of which ~70 MB is resident.
ADDRESS_SPACE_HEADROOM_MB = 1024
# How long past the deadline a worker may take to answer the interrupt before it is killed.
KILL_GRACE_S = 1.0
STARTUP_TIMEOUT_S = 60.0
READY = "ready"
_FRAME = struct.Struct("<Q")


class WorkerLost(Exception):
    """The worker died or was killed before it answered; the message says which."""


class Worker:
    def __init__(self, memory_mb: int):
        self.peak_rss_mb = 0  # read just before a kill, when the worker cannot answer with its own
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C at the terminal is the caller's to handle, not the worker's
        )
        # its start (an interpreter, `import duckdb`) is not part of any query's time
        if self._wait(STARTUP_TIMEOUT_S) != READY:
            raise WorkerLost("the query worker did not start")

    def ask(self, job: dict, deadline_s: float):
        """The worker's answer to `job`; WorkerLost when it is not there within `deadline_s`."""
        try:
            _write(self.process.stdin, job)
        except (BrokenPipeError, OSError):
            raise WorkerLost(f"the query worker exited ({self._exit()})") from None
        answer = self._wait(deadline_s)
        if answer is None:
            raise WorkerLost(f"query stopped after {deadline_s:g} s: it did not answer the interrupt")
        return answer

    def _wait(self, seconds: float):
        """The next frame from the worker, or None (the worker killed) when none came in time."""
        out = self.process.stdout
        if not select.select([out], [], [], seconds)[0]:
            self.kill()
            return None
        try:
            return _read(out)
        except EOFError:
            raise WorkerLost(f"the query worker died ({self._exit()})") from None

    def kill(self) -> None:
        self.peak_rss_mb = max(self.peak_rss_mb, _peak_rss_mb(self.process.pid))
        self.process.kill()
        self.process.wait()

    def _exit(self) -> str:
        code = self.process.wait()
        return f"signal {-code}" if code < 0 else f"exit status {code}"


class Pool:
    """Idle workers by memory limit; a caller takes one for a query (or starts one) and gives it
    back if it is still healthy, so concurrent callers never share a worker."""

    def __init__(self):
        self._idle: dict[int, list[Worker]] = {}
        self._lock = threading.Lock()
        self.peak_rss_mb = 0  # the most any of its workers held, answered or killed: what the limits bound

    def run(self, job: dict, memory_mb: int, deadline_s: float):
        with self._lock:
            idle = self._idle.setdefault(memory_mb, [])
            worker = idle.pop() if idle else None
        worker = worker if worker and worker.process.poll() is None else Worker(memory_mb)
        try:
            answer = worker.ask(job, deadline_s)
        except BaseException:
            worker.kill()  # lost, or left mid-frame: never given back
            self.peak_rss_mb = max(self.peak_rss_mb, worker.peak_rss_mb)
            raise
        self.peak_rss_mb = max(self.peak_rss_mb, answer.get("peak_rss_mb", 0))
        if answer.get("retire"):
            worker.process.wait()
        else:
            with self._lock:
                self._idle[memory_mb].append(worker)
        return answer


POOL = Pool()


def _write(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        raise EOFError
    size = _FRAME.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _peak_rss_mb(pid: int) -> int:
    """A process's peak resident memory (Linux: VmHWM); 0 where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _limit_address_space(memory_mb: int) -> None:
    try:
        import resource
    except ImportError:  # no rlimits on this platform: the deadline still holds
        return
    limit = (memory_mb + ADDRESS_SPACE_HEADROOM_MB) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(memory_mb: int) -> None:
    """The worker's loop: a job in, an answer out, until the caller closes stdin."""
    from tracekit.agent.sandbox import OutOfMemory, QueryRefused, execute

    _limit_address_space(memory_mb)
    stdin = sys.stdin.buffer
    # the frames go to a private copy of stdout, and fd 1 becomes stderr: nothing DuckDB or a stray
    # print writes can corrupt them
    stdout = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _write(stdout, READY)
    while True:
        try:
            job = _read(stdin)
        except EOFError:
            return
        try:
            answer = {"result": execute(memory_mb=memory_mb, **job)}
        except OutOfMemory as e:
            answer = {"refused": (str(e), e.hint), "retire": True}
        except QueryRefused as e:
            answer = {"refused": (str(e), e.hint)}
        answer["peak_rss_mb"] = _peak_rss_mb(os.getpid())
        try:
            _write(stdout, answer)
        except BrokenPipeError:
            return  # the caller is gone
        if answer.get("retire"):
            # the allocator keeps the address space it reserved for the failed query: a fresh
            # worker has the whole limit for the next one
            return


if __name__ == "__main__":
    serve(int(sys.argv[1]))
