"""Report the stages of long work (compile) on stderr, with their times."""

from __future__ import annotations

import sys
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
