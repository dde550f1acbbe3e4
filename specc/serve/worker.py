"""One worker thread runs generations one at a time, in arrival order (batch 1).

At most `max_queue` requests wait behind the running one; `submit` refuses
more (the server answers 503). A job whose client went away is skipped if
it has not started, and stopped after its current round if it has.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Callable


class QueueFull(Exception):
    pass


class Cancelled(Exception):
    pass


class Job:
    def __init__(self, work: Callable[["Job"], object]):
        self.work = work
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.cancelled = threading.Event()


class Worker:
    def __init__(self, max_queue: int):
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.running = False
        self.served = 0
        self.aborted = 0
        self._thread = threading.Thread(target=self._loop, name="specc-generate", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[Job], object]) -> Job:
        job = Job(work)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return job

    def stop(self) -> None:
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass

    def _loop(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self.aborted += 1
                job.future.set_exception(Cancelled())
                continue
            self.running = True
            outcome, failed = None, False
            try:
                outcome = job.work(job)
            except BaseException as exc:   # reported to the request, never kills the worker
                outcome, failed = exc, True
            self.running = False
            if job.cancelled.is_set():
                self.aborted += 1
            else:
                self.served += 1
            if failed:
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)
