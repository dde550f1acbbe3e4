"""Progress bars: `ticking` moves a bar's clock during one long step and stops with the step;
`progress_bar` redraws into a terminal as tqdm does and only now and then into a log."""

import io
import time

from specc.console.progress import TERMINAL_TICK_SECONDS, progress_bar, ticking


class CountingBar:
    def __init__(self, disable=False):
        self.disable, self.refreshes = disable, 0

    def refresh(self):
        self.refreshes += 1


def test_the_bar_is_redrawn_while_the_step_runs_and_not_after():
    bar = CountingBar()
    with ticking(bar, every_seconds=0.01):
        time.sleep(0.2)
    drawn = bar.refreshes
    assert drawn >= 3
    time.sleep(0.05)
    assert bar.refreshes == drawn


def test_a_disabled_bar_is_never_redrawn():
    bar = CountingBar(disable=True)
    with ticking(bar, every_seconds=0.01):
        time.sleep(0.05)
    assert bar.refreshes == 0


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_into_a_log_a_bar_redraws_now_and_then_and_into_a_terminal_as_tqdm_does():
    log, terminal = io.StringIO(), Terminal()
    for stream in (log, terminal):
        with progress_bar(total=500, desc="lowering", file=stream) as bar:
            for _ in range(500):
                bar.update()
                time.sleep(0.001)
    assert log.getvalue().count("\r") <= 3, "a log gets the first and last draw, not one per 0.1 s"
    assert terminal.getvalue().count("\r") > 3


def test_ticking_into_a_log_waits_the_log_interval():
    bar = progress_bar(total=1, file=io.StringIO())
    drawn = bar.fp.getvalue().count("\r")
    with ticking(bar):
        time.sleep(TERMINAL_TICK_SECONDS * 1.5)
    assert bar.fp.getvalue().count("\r") == drawn, "no redraw a second into a log"
    bar.close()
    bar = progress_bar(total=1, file=Terminal())
    drawn = bar.fp.getvalue().count("\r")
    with ticking(bar):
        time.sleep(TERMINAL_TICK_SECONDS * 1.5)
    assert bar.fp.getvalue().count("\r") > drawn, "a terminal's bar clock moves every second"
    bar.close()


def test_the_bench_bar_into_a_log_is_not_redrawn_for_each_run(monkeypatch):
    from specc.bench.runner import run_interleaved
    from specc.bench.memory import MemoryProbe
    from specc.bench.systems import System

    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    systems = [System(name, name, "baseline", lambda ids: ([4], None), 0) for name in ("a", "b")]
    run_interleaved(systems, [[1]] * 20, repeats=2, memory=MemoryProbe(), show_progress=True)
    assert log.getvalue().count("\r") <= 3, log.getvalue()
