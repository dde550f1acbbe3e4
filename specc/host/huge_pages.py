"""CPU tensors moved onto the kernel's huge pages, where it lends them (Linux transparent huge pages).

A decode step on the CPU streams every weight once, and with the kernel's 4 KiB pages that is a
page-table walk every 4 KiB (tens of thousands a step, the page tables themselves evicted by the
stream; in a virtual machine each walk is two-dimensional) and a hardware prefetcher that stops
at every page's end. On 2 MiB pages both costs all but vanish (benchmarks/NOTES.md measures it).
Linux backs anonymous memory with them where a mapping asks (`madvise(MADV_HUGEPAGE)`) under the
default setting `madvise`, or everywhere under `always`; under `never`, or where the kernel has
no such setting, tensors stay where they are. A weight file mapped in place gets them only where
the kernel's page cache holds the file in large folios (recent kernels, some filesystems), so
loading reads the streamed weights onto them rather than depend on that (`specc.engine.weight_pages`),
and memory an AOTInductor package allocates for its own weights is collapsed onto them
(`specc.host.collapsed_pages`).

The tensors are copied once, at load time, into one anonymous mapping aligned to the huge page
size, each at a 64-byte line as torch's own allocator places them; the values, shapes, dtypes and
strides of contiguous tensors are unchanged, so every kernel computes the same bits.
`SPECC_HUGE_PAGES=0` keeps tensors where they are (for comparison, or a machine short of memory).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import torch

ENV_VAR = "SPECC_HUGE_PAGES"
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PAGE_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
LINE = 64
LARGEST_PAGE = 64 * 2**20   # larger huge pages (arm64 with 64 KiB base pages: 512 MiB) would waste too much


def huge_page_bytes() -> int:
    """The size of a huge page this process may ask for, or 0 where it may not."""
    if os.environ.get(ENV_VAR, "1") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    try:
        setting, size = SETTING.read_text(), int(PAGE_SIZE.read_text())
    except (OSError, ValueError):
        return 0
    if "[never]" in setting or not 0 < size <= LARGEST_PAGE:
        return 0
    return size


def huge_page_buffer(nbytes: int, page: int) -> torch.Tensor:
    """`nbytes` zero bytes (uint8) starting on a huge page, in a mapping that asks for huge pages;
    the tensor keeps the mapping alive."""
    pages = -(-nbytes // page) * page
    mapping = mmap.mmap(-1, pages + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # shared memory has its own setting
    start = -_address(mapping) % page
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, pages)
    except OSError:   # refused (a sandbox's filter, say): the buffer serves on ordinary pages
        pass
    return torch.frombuffer(mapping, dtype=torch.uint8)[start:start + nbytes]


def on_huge_pages(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with every contiguous CPU tensor copied into one buffer on huge pages; the others,
    and all of them where huge pages are not lent or would not fill one, as they were."""
    moved = {name: t for name, t in tensors.items() if t.device.type == "cpu" and t.is_contiguous() and t.numel()}
    slots = huge_page_slots({name: t.numel() * t.element_size() for name, t in moved.items()})
    if slots is None:
        return dict(tensors)
    return tensors | {name: slot_as(slots[name], t).copy_(t) for name, t in moved.items()}


def huge_page_slots(sizes: dict[str, int]) -> dict[str, torch.Tensor] | None:
    """A uint8 slot of `sizes[name]` bytes for each name, each on a 64-byte line, all in one buffer
    on huge pages; None where huge pages are not lent or the slots would not fill one."""
    page = huge_page_bytes()
    offsets, total = {}, 0
    for name, nbytes in sizes.items():
        offsets[name] = total
        total += -(-nbytes // LINE) * LINE
    if not page or total < page:
        return None
    buffer = huge_page_buffer(total, page)
    return {name: buffer[offsets[name]:offsets[name] + sizes[name]] for name in sizes}


def slot_as(slot: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The bytes of `slot` seen with `like`'s dtype and shape."""
    return slot.view(like.dtype).view(like.shape)


def _address(mapping: mmap.mmap) -> int:
    return torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
