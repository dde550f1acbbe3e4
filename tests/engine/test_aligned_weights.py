"""Weight files are written so that loading reads every packed tensor in place, and a file
written before (any offset) still loads its packed tensors aligned, as copies."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from specc.engine.aligned_weights import ALIGNMENT, data_offset, save_aligned
from specc.engine.loaded import aligned_packed_weights


def _tensors(name_length: int) -> dict[str, torch.Tensor]:
    """Packed tensors in whole 64-byte lines, as specc's are, beside a bfloat16 norm weight."""
    return {"n" * name_length + ".weight_blocks": torch.randint(0, 255, (3, 64), dtype=torch.uint8),
            "layer.weight_blocks": torch.randint(0, 255, (640,), dtype=torch.uint8),
            "norm.weight": torch.randn(32).bfloat16()}


@pytest.mark.parametrize("name_length", range(1, 17))
def test_every_tensor_of_a_saved_file_starts_on_a_line(tmp_path, name_length):
    tensors = _tensors(name_length)
    save_aligned(tensors, tmp_path / "w.safetensors")
    assert data_offset(tmp_path / "w.safetensors") % ALIGNMENT == 0
    loaded = load_file(tmp_path / "w.safetensors")
    assert all(t.data_ptr() % ALIGNMENT == 0 for t in loaded.values())
    assert all(torch.equal(loaded[name], tensors[name]) for name in tensors)
    kept = aligned_packed_weights(loaded)
    assert all(kept[name] is loaded[name] for name in loaded), "nothing copied"


def test_a_file_written_unaligned_loads_its_packed_tensors_as_aligned_copies(tmp_path):
    for name_length in range(1, 17):   # some name length leaves the data off a line
        save_file(_tensors(name_length), str(tmp_path / "w.safetensors"))
        if data_offset(tmp_path / "w.safetensors") % ALIGNMENT:
            break
    assert data_offset(tmp_path / "w.safetensors") % ALIGNMENT
    loaded = load_file(tmp_path / "w.safetensors")
    kept = aligned_packed_weights(loaded)
    packed = [name for name in loaded if not loaded[name].is_floating_point()]
    assert packed and all(kept[name].data_ptr() % ALIGNMENT == 0 for name in packed)
    assert all(torch.equal(kept[name], loaded[name]) for name in loaded)
