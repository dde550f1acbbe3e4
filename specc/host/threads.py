"""How many CPU threads torch uses: one policy for every verb.

torch's own default is one intra-op thread per physical core. That is the
fastest choice on an idle machine and a collapse on a busy one: OpenMP
workers spin at their barriers waiting for a core another process holds,
and small models (where every op is short) slow down 20-100x. specc's
default, unless told otherwise:

1. ``--threads N`` (or ``threads=N`` from Python) wins;
2. else ``$OMP_NUM_THREADS`` (or ``$SPECC_THREADS``) if set, as torch reads it;
3. else the physical cores not already busy: ``max(1, min(cores - round(busy), 4))``,
   where `busy` is the cores other processes keep busy *now*, sampled from
   /proc/stat over `BUSY_SAMPLE_SECONDS` while this process waits (the
   1-minute load average where /proc/stat is missing). An idle 2-core
   machine gets 2, the same machine running one other job gets 1. The load
   average would still count a compile that ended seconds ago, and give a
   `specc bench` run right after `specc compile` one thread of two.

In case 3 the load is sampled again during long CPU work (compile-time
training: `LoadFollower`), since other jobs start and stop over its minutes.
"""

from __future__ import annotations

import contextlib
import os
import time

from specc.host.cpuinfo import cpuinfo_text, physical_core_ids

ENV_VARS = ("SPECC_THREADS", "OMP_NUM_THREADS")
MAX_DEFAULT_THREADS = 4
BUSY_SAMPLE_SECONDS = 0.2


def physical_cores() -> int:
    """Physical cores (hyper-threads not counted), from /proc/cpuinfo when it says, else os.cpu_count()."""
    text = cpuinfo_text()
    cores = physical_core_ids(text) if text is not None else set()
    return len(cores) or os.cpu_count() or 1


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]    # idle + iowait
    total = sum(fields[:8])         # guest time is already counted in user time
    return total - idle, total


def busy_cpus(seconds: float = BUSY_SAMPLE_SECONDS) -> tuple[float, str]:
    """(CPUs other processes keep busy, what it was measured from): /proc/stat sampled over
    `seconds` while this process sleeps, else the 1-minute load average."""
    before = _cpu_times()
    if before is not None:
        time.sleep(seconds)
        after = _cpu_times()
        if after is not None and after[1] > before[1]:
            share = (after[0] - before[0]) / (after[1] - before[1])
            return share * (os.cpu_count() or 1), f"busy now {share * (os.cpu_count() or 1):.1f}"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return load, f"load {load:.1f}"


def default_threads() -> tuple[int, str]:
    """(threads, why) by the policy above, without touching torch."""
    for name in ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return int(value), f"${name}"
    cores = min(physical_cores(), available_cpus())
    busy, measured = busy_cpus()
    free = cores - int(round(busy))
    return max(1, min(free, cores, MAX_DEFAULT_THREADS)), f"{cores} cores, {measured} (other processes)"


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


_follows_load = False   # whether the count came from the machine's load (case 3 of the policy)
_chosen: tuple[int, str] | None = None   # what apply_threads chose, and why
FOLLOW_INTERVAL_SECONDS = 10.0


def apply_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads by the policy; returns the count."""
    global _follows_load, _chosen
    if requested is not None:
        _chosen = resolve_threads(requested), "--threads"
    else:
        _chosen = default_threads()
    threads = _chosen[0]
    _follows_load = requested is None and not _chosen[1].startswith("$")
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def chosen_threads() -> tuple[int, str]:
    """(threads torch uses, why): what `apply_threads` chose, or torch's own count when nothing
    applied the policy (the Python API without threads=) or something changed it since."""
    import torch

    count = torch.get_num_threads()
    if _chosen is not None and _chosen[0] == count:
        return _chosen
    return count, "set outside specc's policy"


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

