"""How many CPU threads torch uses: one policy for every verb.

torch's own default is one intra-op thread per physical core. That is the
fastest choice on an idle machine and a collapse on a busy one: OpenMP
workers spin at their barriers waiting for a core another process holds,
and small models (where every op is short) slow down 20-100x. specc's
default, unless told otherwise:

1. ``--threads N`` (or ``threads=N`` from Python) wins;
2. else ``$OMP_NUM_THREADS`` (or ``$SPECC_THREADS``) if set, as torch reads it;
3. else the physical cores not already busy, from the 1-minute load
   average: ``max(1, min(cores - round(load), 4))``. An idle 2-core
   machine gets 2, the same machine running one other job gets 1.

In case 3 the load is sampled again during long CPU work (compile-time
training: `follow_load`), since other jobs start and stop over its minutes.
"""

from __future__ import annotations

import contextlib
import os
import time

ENV_VARS = ("SPECC_THREADS", "OMP_NUM_THREADS")
MAX_DEFAULT_THREADS = 4


def physical_cores() -> int:
    """Physical cores (hyper-threads not counted), from /proc/cpuinfo when it says, else os.cpu_count()."""
    try:
        seen = set()
        physical_id = core_id = None
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    physical_id = value.strip()
                elif key == "core id":
                    core_id = value.strip()
                elif not key and core_id is not None:
                    seen.add((physical_id, core_id))
                    physical_id = core_id = None
        if core_id is not None:
            seen.add((physical_id, core_id))
        if seen:
            return len(seen)
    except OSError:
        pass
    return os.cpu_count() or 1


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> tuple[int, str]:
    """(threads, why) by the policy above, without touching torch."""
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return int(value), f"${name}"
    cores = min(physical_cores(), available_cpus())
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    free = cores - int(round(load))
    return max(1, min(free, cores, MAX_DEFAULT_THREADS)), f"{cores} cores, load {load:.1f}"


def idle_machine_threads() -> int:
    """What the policy gives this machine when idle and unconfigured: the physical cores
    (at most `MAX_DEFAULT_THREADS`). Ahead-of-time kernels are built for this count, not
    for the threads the compile itself happens to run with (see `specc.lower.aoti`)."""
    return max(1, min(physical_cores(), available_cpus(), MAX_DEFAULT_THREADS))


def resolve_threads(requested: int | None) -> int:
    from specc.errors import UsageError

    if requested is not None:
        if requested < 1:
            raise UsageError(f"--threads {requested} must be at least 1")
        return requested
    return default_threads()[0]


_follows_load = False   # whether the count came from the load average (case 3 of the policy)
FOLLOW_INTERVAL_SECONDS = 10.0


def apply_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads by the policy; returns the count."""
    global _follows_load
    threads = resolve_threads(requested)
    _follows_load = requested is None and not default_threads()[1].startswith("$")
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def torch_threads(count: int):
    """Torch's intra-op threads set to `count` for the block, then restored."""
    import torch

    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LoadFollower:
    """Call it once per unit of long CPU work (a training step, a teacher window): every
    `FOLLOW_INTERVAL_SECONDS` it re-applies the load-average policy, counting this process's
    own threads out of the load. Does nothing unless `apply_threads` chose the count from the
    load (an explicit `--threads` or environment variable is kept)."""

    def __init__(self, interval: float = FOLLOW_INTERVAL_SECONDS):
        self.interval = interval
        self.last = time.monotonic()

    def __call__(self) -> None:
        if not _follows_load or time.monotonic() - self.last < self.interval:
            return
        self.last = time.monotonic()
        import torch

        own = torch.get_num_threads()
        try:
            others = max(0.0, os.getloadavg()[0] - own)
        except (AttributeError, OSError):
            return
        cores = min(physical_cores(), available_cpus())
        threads = max(1, min(cores - int(round(others)), cores, MAX_DEFAULT_THREADS))
        if threads != own:
            torch.set_num_threads(threads)

