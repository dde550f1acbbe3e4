"""Report the stages of long work (compile) on stderr, with their times."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager


class StageReporter:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, description: str, own_line: bool = False):
        """`own_line`: the stage shows its own progress (a bar, summary lines), so its
        line is ended first and its time is reported on a line of its own."""
        from specc.console import interrupts

        interrupts.check()
        if self.enabled:
            print(f"  {description} ...", end="\n" if own_line else "", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
            interrupts.check()
        except BaseException as exc:
            if self.enabled:
                word = "interrupted" if isinstance(exc, (KeyboardInterrupt, interrupts.Terminated)) else "failed"
                print(f"  {description}: {word}" if own_line else f" {word}", file=sys.stderr, flush=True)
            raise
        elapsed = time.perf_counter() - start
        self.seconds[description] = round(elapsed, 3)
        if self.enabled:
            print(f"  {description}: {elapsed:.1f}s" if own_line else f" {elapsed:.1f}s", file=sys.stderr,
                  flush=True)


@contextmanager
def ticking(bar, every_seconds: float = 1.0):
    """Redraw `bar` every `every_seconds` while the block runs, so its elapsed time moves
    during one long step (tqdm redraws only when the bar advances)."""
    if getattr(bar, "disable", False):
        yield bar
        return
    stop = threading.Event()

    def tick():
        while not stop.wait(every_seconds):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="specc-progress-ticker", daemon=True)
    ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        ticker.join()
