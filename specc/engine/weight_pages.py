"""An engine's streamed weights read from its weight file straight onto huge pages.

Every decode step streams the weights its graphs read whole, and on 4 KiB pages that costs the
step a page-table walk every 4 KiB (`specc.host.huge_pages`). A quantized engine's packed weights
(its integer tensors) are read onto huge pages always; a floating-point tensor only where the
backend runs the graph's own tensors (`Backend.runs_graph_weights`: eager, inductor) and a
graph reads it whole (`attributes_streamed`): an embedding table, looked up a row at a time,
stays mapped from the file, on disk until a row is needed, and a backend that holds its own copy
of the weights (AOTInductor, ONNX Runtime) leaves the graph's untouched. They are read with the
file's own reads into one buffer on huge pages, past the mapping that loading made: copying them
out of the mapping would leave every page of them resident there too. Where huge pages are not
lent, the tensors stay mapped as loaded.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection
from pathlib import Path

import torch

from specc.host.huge_pages import huge_page_slots, slot_as


def weights_on_huge_pages(path: Path, tensors: dict[str, torch.Tensor],
                          floats: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """`tensors`, loaded from the safetensors file at `path`, with its packed (integer) CPU
    tensors and the floating-point ones named in `floats` replaced by copies on huge pages read
    from the file."""
    moved = {name: t for name, t in tensors.items()
             if (not t.is_floating_point() or name in floats) and t.device.type == "cpu" and t.numel()}
    slots = huge_page_slots({name: t.numel() * t.element_size() for name, t in moved.items()})
    if slots is None:
        return tensors
    starts = tensor_offsets(path)
    with open(path, "rb", buffering=0) as file:
        for name, slot in slots.items():
            _read_exactly(file, starts[name], slot)
    return tensors | {name: slot_as(slots[name], t) for name, t in moved.items()}


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
