"""SIGINT and SIGTERM become exceptions the CLI turns into one line and exit 130 / 143.

Both raise in the main thread, so every ``finally`` (staging directories,
temporary files) runs; the default SIGTERM action would kill the process
without running any. A signal that arrives inside a ``__del__`` (the garbage
collector runs finalizers at arbitrary points) cannot raise there: Python
would print "Exception ignored in ..." and carry on. Such a signal is kept
pending and raised a moment later, outside the finalizer, and `check()`
(called between compile stages) raises a pending one too.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM: like KeyboardInterrupt, not caught by ``except Exception``."""


EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_pending: int | None = None


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _handler(signum, frame):
    global _pending
    if _in_finalizer(frame):
        _pending = signum
        # Raise again shortly, once the finalizer has returned.
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    _pending = None
    raise _exception(signum)


def _alarm(signum, frame):
    if _pending is None:
        return
    if _in_finalizer(frame):
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    pending = _pending
    _handler(pending, frame)


@contextmanager
def handled():
    """Route SIGINT / SIGTERM through `_handler` inside the block (main thread only),
    restoring the previous handlers after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
    previous = {s: signal.getsignal(s) for s in signals}
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGALRM, _alarm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def check() -> None:
    """Raise a signal that arrived while it could not be raised."""
    global _pending
    if _pending is not None:
        signum, _pending = _pending, None
        raise _exception(signum)


def exit_code(exc: BaseException) -> int:
    return 143 if isinstance(exc, Terminated) else 130


def message(exc: BaseException) -> str:
    return "specc: terminated" if isinstance(exc, Terminated) else "specc: interrupted"


