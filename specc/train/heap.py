"""Give freed heap memory back to the OS inside loops that keep a little of each step.

glibc raises its mmap threshold after freeing a large mmapped block, so a
loop that allocates tens of MB per step (a target forward's logits over a
window) while keeping a few hundred KB per step (cached teacher outputs)
serves the large blocks from the heap, and the kept blocks pin the freed
space between them, so resident memory grows by far more per window than the
cache holds (measured on Kangaroo's teacher cache:
benchmarks/NOTES.md#training-caches-and-freed-heap-memory). `malloc_trim` returns
those freed pages; elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def releasing(items: Iterable[T]) -> Iterator[T]:
    """`items`, returning freed memory to the OS after the loop body has handled each one."""
    for item in items:
        yield item
        release_freed_memory()


def release_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):
        return None
