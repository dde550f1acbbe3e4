"""A quantized engine's packed weights read from its weight file straight onto huge pages.

Every decode step streams the packed weights (the integer tensors of a `--quantize` engine) whole,
and on 4 KiB pages that costs the step a page-table walk every 4 KiB (`specc.host.huge_pages`).
They are read with the file's own reads into one buffer on huge pages, past the mapping that
loading made: copying them out of the mapping would leave every page of them resident there too,
the mapping being kept for the floating-point tensors (an embedding table, looked up a row at a
time, stays on disk until a row is needed). Where huge pages are not lent, the tensors stay
mapped as loaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from specc.host.huge_pages import huge_page_slots, slot_as


def packed_on_huge_pages(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors`, loaded from the safetensors file at `path`, with its packed (integer, CPU)
    tensors replaced by copies on huge pages read from the file."""
    packed = {name: t for name, t in tensors.items()
              if not t.is_floating_point() and t.device.type == "cpu" and t.numel()}
    slots = huge_page_slots({name: t.numel() * t.element_size() for name, t in packed.items()})
    if slots is None:
        return tensors
    starts = tensor_offsets(path)
    with open(path, "rb", buffering=0) as file:
        for name, slot in slots.items():
            _read_exactly(file, starts[name], slot)
    return tensors | {name: slot_as(slots[name], t) for name, t in packed.items()}


def tensor_offsets(path: Path) -> dict[str, int]:
    """Where in the safetensors file at `path` each tensor's bytes begin."""
    with open(path, "rb") as file:
        length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(length))
    return {name: 8 + length + entry["data_offsets"][0] for name, entry in header.items() if name != "__metadata__"}


def _read_exactly(file, offset: int, slot: torch.Tensor) -> None:
    view = memoryview(slot.numpy())
    file.seek(offset)
    done = 0
    while done < len(view):
        read = file.readinto(view[done:])
        if not read:
            raise OSError(f"{file.name} ended {len(view) - done} bytes early")
        done += read
