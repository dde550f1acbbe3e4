"""Peak resident memory around each timed run.

On Linux the RSS high-water mark (VmHWM) can be reset by writing 5 to
/proc/self/clear_refs, so each run's own peak is measured. The figure is
the whole process's RSS: it includes every model the benchmark keeps
loaded, so compare the growth above the pre-run RSS, not the peaks. Where
the reset is not possible, only the process-lifetime peak from
`resource.getrusage` is reported. (tracemalloc would miss tensor memory,
which torch allocates outside Python's allocator; the CUDA allocator's
counters would apply only to a GPU run, and the engine runs on CPU.)
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MemoryProbe:
    def __init__(self):
        self.per_run = _can_reset_peak()
        self.method = ("Linux VmHWM (process RSS high-water) reset before each run via /proc/self/clear_refs"
                       if self.per_run else
                       "process RSS high-water over the whole benchmark (resource.getrusage); no per-run figure")

    def start(self) -> int | None:
        """Reset the peak; return the RSS now (bytes), or None if unmeasurable."""
        if not self.per_run:
            return None
        _CLEAR_REFS.write_text("5")
        return _status_bytes("VmRSS")

    def peak(self) -> int | None:
        return _status_bytes("VmHWM") if self.per_run else None


def process_peak_rss_bytes() -> int:
    """`ru_maxrss` is in KiB on Linux and in bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _can_reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return _status_bytes("VmHWM") is not None
    except OSError:
        return False


def _status_bytes(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
