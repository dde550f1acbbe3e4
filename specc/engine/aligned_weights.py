"""Weight files whose every tensor starts on a 64-byte boundary, so loading reads them in place.

A safetensors file is an 8-byte length, a JSON header, then the tensors back to back; loading
maps the file and hands out views at those offsets. specc's packed weights are sized in whole
64-byte lines, so when the data begins on a line every packed tensor does; where it did not,
loading had to copy every packed tensor to an aligned address: memory of its own the size of
the weights, beside the file's pages. The header's length is set by
padding a metadata entry: each character added past the JSON's own 8-byte padding moves the
data by one byte, so one rewrite at most aligns it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch
from safetensors.torch import save_file

ALIGNMENT = 64   # bytes: what PyTorch's CPU allocator gives every tensor, and a cache line
PADDING_KEY = "specc_alignment_padding"


def save_aligned(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={PADDING_KEY: ""})
    past = data_offset(path) % ALIGNMENT
    if past:
        save_file(tensors, str(path), metadata={PADDING_KEY: " " * (ALIGNMENT - past)})


def data_offset(path: Path) -> int:
    """Where the tensors of the safetensors file at `path` begin."""
    with open(path, "rb") as file:
        return 8 + struct.unpack("<Q", file.read(8))[0]
