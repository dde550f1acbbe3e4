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
    def stage(self, description: str):
        if self.enabled:
            print(f"  {description} ...", end="", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if self.enabled:
                print(" failed", file=sys.stderr, flush=True)
            raise
        elapsed = time.perf_counter() - start
        self.seconds[description] = round(elapsed, 3)
        if self.enabled:
            print(f" {elapsed:.1f}s", file=sys.stderr, flush=True)
