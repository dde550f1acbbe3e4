"""Run every system on every prompt, interleaved, after one warm-up each.

Within a repeat, each prompt is run by all systems back to back, in an order
rotated per prompt and repeat, so slow drifts of the machine (heat, other
load) spread over all systems instead of landing on one. A system's method
report is taken after each of its runs, outside the timing, and once after
its warm-up to discard what the warm-up counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specc.bench.memory import MemoryProbe
from specc.bench.systems import System
from specc.runtime.stats import GenerationStats


@dataclass
class Run:
    system: str
    prompt_index: int
    repeat: int
    seconds: float
    token_ids: list[int]
    stats: GenerationStats | None
    rss_before_bytes: int | None = None
    peak_rss_bytes: int | None = None
    method_report: dict | None = None   # the method's own report on this generation, if it made one

    def to_json(self) -> dict:
        return {"system": self.system, "prompt_index": self.prompt_index, "repeat": self.repeat,
                "seconds": round(self.seconds, 6), "new_tokens": len(self.token_ids),
                "tokens_per_second": round(len(self.token_ids) / self.seconds, 3) if self.seconds > 0 else None,
                "rss_before_bytes": self.rss_before_bytes, "peak_rss_bytes": self.peak_rss_bytes,
                "stats": self.stats.to_json() if self.stats is not None else None,
                "method_report": self.method_report}


def run_interleaved(systems: list[System], prompts: list[list[int]], repeats: int, memory: MemoryProbe,
                    show_progress: bool = True, between_repeats=None) -> list[Run]:
    """Every system on every prompt, `repeats` times; `between_repeats()`, if given, runs before each
    repeat and after the last (the bandwidth samples), outside every timed run."""
    from specc.console.progress import in_terminal, progress_bar

    total = len(systems) * (1 + repeats * len(prompts))
    runs: list[Run] = []
    with progress_bar(total=total, desc="bench", unit="run", disable=not show_progress, leave=False) as progress:
        redraw = in_terminal(progress)
        for system in systems:
            progress.set_postfix_str(f"warm-up {system.name}", refresh=redraw)
            system.generate(prompts[0])
            take_method_report(system)   # the warm-up's counts are not a run's
            progress.update()
        for repeat in range(repeats):
            if between_repeats is not None:
                between_repeats()
            for index, prompt_ids in enumerate(prompts):
                for system in _rotated(systems, repeat + index):
                    progress.set_postfix_str(f"repeat {repeat + 1}/{repeats} {system.name}", refresh=redraw)
                    runs.append(timed_run(system, prompt_ids, index, repeat, memory))
                    progress.update()
        if between_repeats is not None:
            between_repeats()
    return runs


def timed_run(system: System, prompt_ids: list[int], index: int, repeat: int, memory: MemoryProbe) -> Run:
    rss_before = memory.start()
    start = time.perf_counter()
    token_ids, stats = system.generate(prompt_ids)
    seconds = time.perf_counter() - start
    peak = memory.peak()
    return Run(system.name, index, repeat, seconds, token_ids, stats, rss_before, peak, take_method_report(system))


def take_method_report(system: System) -> dict | None:
    """The system's method report on its generations since the last call; None when it has
    no method report or reported nothing."""
    if system.take_method_report is None:
        return None
    return system.take_method_report() or None


def _rotated(items: list, shift: int) -> list:
    shift %= len(items)
    return items[shift:] + items[:shift]
