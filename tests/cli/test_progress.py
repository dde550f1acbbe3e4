"""`ticking`: a progress bar's clock moves during one long step, and stops with the step."""

import time

from specc.console.progress import ticking


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
