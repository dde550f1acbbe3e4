"""Memory a library allocates for itself while loading, moved onto huge pages in place.

An AOTInductor package built with its weights (a float engine's: freezing prepacks them) copies
them at load time into memory it allocates itself, on 4 KiB pages, and every decode step streams
them from there (`specc.host.huge_pages` says what 4 KiB pages cost a stream). That memory is not
specc's to place, so loading notes the process's anonymous writable mappings before the library
runs and afterwards asks Linux to rebuild each new one of at least two huge pages on huge pages
(`madvise(MADV_COLLAPSE)`, Linux 6.1 and later: the kernel copies the pages it already holds
onto huge pages and maps those in their place; the values do not change). A kernel that refuses
(older, huge pages not lent, a sandbox's filter, no free huge page) leaves the memory as it was.
`SPECC_HUGE_PAGES=0` turns this off with the rest of specc's huge pages.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from specc.host.huge_pages import huge_page_bytes

MADV_COLLAPSE = 25
MAPS = Path("/proc/self/maps")
MIN_PAGES = 2      # a mapping that cannot hold two whole huge pages is not worth a call

Range = tuple[int, int]


@contextlib.contextmanager
def new_memory_on_huge_pages() -> Iterator[None]:
    """Collapse the anonymous memory the body maps (and still holds when it ends) onto huge pages."""
    page = huge_page_bytes()
    before = anonymous_ranges() if page else []
    yield
    if page:
        for start, end in new_ranges(before, anonymous_ranges()):
            collapse(start, end, page)


def anonymous_ranges(maps: str | None = None) -> list[Range]:
    """(start, end) of each private writable mapping that maps no file (the heap and anonymous
    mappings; not the stack's or the kernel's named regions), from /proc/self/maps."""
    if maps is None:
        try:
            maps = MAPS.read_text()
        except OSError:
            return []
    ranges = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p":
            continue
        name = fields[5].strip() if len(fields) > 5 else ""
        if name in ("", "[heap]"):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def new_ranges(before: list[Range], after: list[Range]) -> list[Range]:
    """The parts of `after`'s ranges that no range of `before` covers (mappings merge with their
    neighbours, so a new allocation may extend a range that was already there)."""
    old = sorted(before)
    new = []
    for start, end in sorted(after):
        for old_start, old_end in old:
            if old_end <= start or old_start >= end:
                continue
            if old_start > start:
                new.append((start, old_start))
            start = max(start, old_end)
            if start >= end:
                break
        if start < end:
            new.append((start, end))
    return new


def collapse(start: int, end: int, page: int) -> bool:
    """Ask the kernel to map the whole huge pages inside [start, end) on huge pages; whether it did."""
    first, last = -(-start // page) * page, end // page * page
    if last - first < MIN_PAGES * page:
        return False
    madvise = _madvise()
    return madvise is not None and madvise(first, last - first, MADV_COLLAPSE) == 0


@cache
def _madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.madvise
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = (ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return function
