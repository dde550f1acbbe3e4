"""Memory mapped while loading is found by diffing /proc/self/maps, collapsed onto huge pages where
the kernel does it, with its values unchanged, and left alone where huge pages are not lent."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from specc.host import collapsed_pages, huge_pages
from specc.host.collapsed_pages import anonymous_ranges, collapse, new_memory_on_huge_pages, new_ranges

PAGE = 2 * 2**20

MAPS = """\
55d0c000-55d0e000 r--p 00000000 fd:01 123   /usr/bin/python3.11
55d0e000-55d10000 rw-p 00002000 fd:01 123   /usr/bin/python3.11
55d10000-55d90000 rw-p 00000000 00:00 0     [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
7f0000400000-7f0000600000 r--p 00000000 00:00 0
7f0000600000-7f0000800000 rw-s 00000000 00:05 77   /dev/zero (deleted)
7f0000800000-7f0000a00000 rw-p 00000000 fd:01 456   /tmp/model.so
7ffc0000-7ffe0000 rw-p 00000000 00:00 0     [stack]
7ffe1000-7ffe3000 r-xp 00000000 00:00 0     [vdso]
"""


def test_only_private_writable_memory_of_no_file_counts():
    assert anonymous_ranges(MAPS) == [(0x55D10000, 0x55D90000), (0x7F0000000000, 0x7F0000400000)]


@pytest.mark.parametrize("before, after, new", [
    ([], [(0, 10)], [(0, 10)]),
    ([(0, 10)], [(0, 10)], []),
    ([(0, 10)], [(0, 30)], [(10, 30)]),                        # a new mapping merged after an old one
    ([(20, 30)], [(0, 30)], [(0, 20)]),                        # ... and before one
    ([(10, 20), (30, 40)], [(0, 50)], [(0, 10), (20, 30), (40, 50)]),
    ([(0, 10), (40, 50)], [(0, 10), (20, 30), (40, 50)], [(20, 30)]),
    ([(0, 100)], [(20, 30)], []),                              # a range that shrank
])
def test_new_ranges_are_what_no_old_range_covers(before, after, new):
    assert new_ranges(before, after) == new


def test_only_whole_huge_pages_are_asked_for_and_only_two_or_more(monkeypatch):
    calls = []
    monkeypatch.setattr(collapsed_pages, "_madvise", lambda: lambda start, length, advice: calls.append((start, length, advice)) or 0)
    assert not collapse(PAGE + 4096, 4 * PAGE - 1, PAGE) and calls == []   # one whole page inside: too small
    assert collapse(PAGE + 4096, 5 * PAGE - 1, PAGE)
    assert calls == [(2 * PAGE, 2 * PAGE, collapsed_pages.MADV_COLLAPSE)]


def test_memory_mapped_inside_is_collapsed_with_its_values(huge_pages_lent, monkeypatch):
    collapsed = []
    original = collapsed_pages.collapse
    monkeypatch.setattr(collapsed_pages, "collapse", lambda start, end, page: collapsed.append((start, end)) or original(start, end, page))
    with new_memory_on_huge_pages():
        mapping = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        values = torch.frombuffer(mapping, dtype=torch.int32)
        values.copy_(torch.arange(values.numel(), dtype=torch.int32))
    start = values.data_ptr()
    assert any(begin <= start and start + 8 * PAGE <= end for begin, end in collapsed)
    assert torch.equal(values, torch.arange(values.numel(), dtype=torch.int32))
    if not _collapses_here():
        pytest.skip("this kernel does not collapse memory onto huge pages (MADV_COLLAPSE): only the finding was checked")
    assert _huge_bytes(start) >= 6 * PAGE   # the whole pages inside the mapping


def test_nothing_is_asked_where_huge_pages_are_not_lent(huge_pages_lent, monkeypatch):
    huge_pages_lent.write_text("always madvise [never]")
    monkeypatch.setattr(collapsed_pages, "anonymous_ranges", lambda: pytest.fail("read the maps"))
    with new_memory_on_huge_pages():
        pass


def _collapses_here() -> bool:
    mapping = mmap.mmap(-1, 4 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer = torch.frombuffer(mapping, dtype=torch.uint8)
    buffer.fill_(1)
    start = buffer.data_ptr()
    return collapse(start, start + 4 * PAGE, PAGE) and _huge_bytes(start) > 0


def _huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds `address`, in bytes."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and all(part and all(c in "0123456789abcdef" for c in part) for part in head.split("-")):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_the_environment_switch_turns_it_off(huge_pages_lent, monkeypatch):
    monkeypatch.setenv(huge_pages.ENV_VAR, "0")
    monkeypatch.setattr(collapsed_pages, "anonymous_ranges", lambda: pytest.fail("read the maps"))
    with new_memory_on_huge_pages():
        pass
