"""Tensors moved onto huge pages keep their values, dtypes, shapes and line alignment; the mapping
asks the kernel for huge pages; nothing moves where huge pages are refused or not lent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specc.host import huge_pages
from specc.host.huge_pages import huge_page_buffer, huge_page_bytes, huge_page_slots, on_huge_pages
from specc.runtime.kv_cache import KVCache

PAGE = 2 * 2**20


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"packed": torch.randint(0, 256, (3 * PAGE + 5,), dtype=torch.uint8, generator=generator),
            "weight": torch.randn(300, 577, generator=generator).to(torch.bfloat16),
            "scalar": torch.tensor(2.5), "mask": torch.tensor([True, False, True]),
            "transposed": torch.randn(8, 4, generator=generator).t()}


def test_moved_tensors_keep_their_values_and_start_on_lines(huge_pages_lent):
    tensors = _tensors()
    moved = on_huge_pages(tensors)
    assert list(moved) == list(tensors)
    for name, tensor in tensors.items():
        assert moved[name].dtype == tensor.dtype and moved[name].shape == tensor.shape
        assert torch.equal(moved[name], tensor)
    contiguous = [name for name, tensor in tensors.items() if tensor.is_contiguous()]
    assert all(moved[name].data_ptr() != tensors[name].data_ptr() for name in contiguous)
    assert all(moved[name].data_ptr() % huge_pages.LINE == 0 for name in contiguous)
    assert moved["transposed"] is tensors["transposed"]   # strides are kept, so only contiguous tensors move


def test_the_buffer_starts_on_a_huge_page_and_asks_for_them(huge_pages_lent):
    buffer = huge_page_buffer(PAGE + 100, PAGE)
    assert buffer.numel() == PAGE + 100 and buffer.data_ptr() % PAGE == 0 and not buffer.any()
    assert "hg" in _vm_flags(buffer.data_ptr())   # madvise(MADV_HUGEPAGE) took


@pytest.mark.parametrize("setting, env", [("always madvise [never]", None), ("always [madvise] never", "0")])
def test_nothing_moves_where_huge_pages_are_refused(huge_pages_lent, monkeypatch, setting, env):
    huge_pages_lent.write_text(setting)
    if env is not None:
        monkeypatch.setenv(huge_pages.ENV_VAR, env)
    tensors = _tensors()
    assert huge_page_bytes() == 0
    assert all(moved is tensors[name] for name, moved in on_huge_pages(tensors).items())


def test_nothing_moves_where_the_kernel_has_no_setting(huge_pages_lent, monkeypatch, tmp_path):
    monkeypatch.setattr(huge_pages, "SETTING", tmp_path / "missing")
    assert huge_page_bytes() == 0


def test_tensors_smaller_than_a_page_stay(huge_pages_lent):
    small = {"a": torch.ones(10), "b": torch.zeros(3, 3)}
    assert all(moved is small[name] for name, moved in on_huge_pages(small).items())


def test_slots_start_on_lines_in_one_buffer(huge_pages_lent):
    slots = huge_page_slots({"a": 100, "b": PAGE, "c": 1})
    assert [slots[name].numel() for name in "abc"] == [100, PAGE, 1]
    assert slots["b"].data_ptr() - slots["a"].data_ptr() == 128 and slots["c"].data_ptr() - slots["b"].data_ptr() == PAGE
    assert huge_page_slots({"a": 100}) is None   # would not fill a page


def test_kv_caches_share_one_buffer_on_huge_pages(huge_pages_lent):
    cache = KVCache(num_layers=4, kv_heads=2, head_dim=64, max_seq_len=4096, dtype=torch.bfloat16)
    first = cache.tensors[0].data_ptr()
    bytes_each = cache.tensors[0].numel() * 2
    assert [t.data_ptr() - first for t in cache.tensors] == [i * bytes_each for i in range(8)]
    assert all(not t.any() and t.shape == (1, 2, 4097, 64) for t in cache.tensors)


def _vm_flags(address: int) -> str:
    """The VmFlags line of the mapping of this process that holds `address`."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and all(part and all(c in "0123456789abcdef" for c in part) for part in head.split("-")):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("offset", [0, 4096, PAGE - 4096])
def test_the_buffer_fits_its_mapping_wherever_the_mapping_starts(huge_pages_lent, monkeypatch, offset):
    """Kernels that do not align a large mapping to a huge page leave the buffer starting inside the
    mapping's first page; the advice then still covers only mapped memory."""
    monkeypatch.setattr(huge_pages, "_address", lambda mapping: PAGE * 16 + offset)
    buffer = huge_page_buffer(PAGE + 100, PAGE)
    assert buffer.numel() == PAGE + 100
    buffer[-1] = 7   # inside the mapping
    assert "hg" in _vm_flags(buffer.data_ptr()) and "hg" in _vm_flags(buffer.data_ptr() + PAGE + 99)
