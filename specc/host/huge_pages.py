"""CPU tensors moved onto the kernel's huge pages, where it lends them (Linux transparent huge pages).

A decode step on the CPU streams every weight once, and with the kernel's 4 KiB pages that is a
page-table walk every 4 KiB (tens of thousands a step, the page tables themselves evicted by the
stream; in a virtual machine each walk is two-dimensional) and a hardware prefetcher that stops
at every page's end. On 2 MiB pages both costs all but vanish (benchmarks/NOTES.md measures it).
Linux backs anonymous memory with them where a mapping asks (`madvise(MADV_HUGEPAGE)`) under the
default setting `madvise`, or everywhere under `always`; under `never`, or where the kernel has
no such setting, tensors stay where they are. A weight file mapped in place gets them only where
the kernel's page cache holds the file in large folios (recent kernels, some filesystems), so
loading copies the weights rather than depend on that.

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
    mapping = mmap.mmap(-1, nbytes + page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # shared memory has its own setting
    start = -_address(mapping) % page
    mapping.madvise(mmap.MADV_HUGEPAGE, start, (nbytes + page - 1) // page * page)
    return torch.frombuffer(mapping, dtype=torch.uint8)[start:start + nbytes]


def on_huge_pages(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with every contiguous CPU tensor copied into one buffer on huge pages; the others,
    and all of them where huge pages are not lent or would not fill one, as they were."""
    page = huge_page_bytes()
    moved = {name: t for name, t in tensors.items() if t.device.type == "cpu" and t.is_contiguous() and t.numel()}
    offsets, total = _line_offsets(moved)
    if not page or total < page:
        return dict(tensors)
    buffer = huge_page_buffer(total, page)
    placed = dict(tensors)
    for name, tensor in moved.items():
        nbytes = tensor.numel() * tensor.element_size()
        copy = buffer[offsets[name]:offsets[name] + nbytes].view(tensor.dtype).view(tensor.shape)
        placed[name] = copy.copy_(tensor)
    return placed


def _line_offsets(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, int], int]:
    offsets, total = {}, 0
    for name, tensor in tensors.items():
        offsets[name] = total
        total += -(-tensor.numel() * tensor.element_size() // LINE) * LINE
    return offsets, total


def _address(mapping: mmap.mmap) -> int:
    return torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
