"""An engine's streamed weights read from its file onto huge pages: the same values, dtypes and
shapes, on lines of their own buffer; packed (integer) tensors always, floating-point ones only
where named (an eager engine's weights that its graphs read whole, not its embedding table);
nothing moves where huge pages are not lent."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from specc.engine.aligned_weights import save_aligned
from specc.engine.weight_pages import tensor_offsets, weights_on_huge_pages

PAGE = 2 * 2**20


def _weights(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {"layers.0.packed": torch.randint(0, 256, (PAGE + 77,), dtype=torch.uint8, generator=generator),
               "embedding": torch.randn(50, 64, generator=generator).to(torch.bfloat16),
               "layers.1.packed": torch.randint(0, 256, (3, 1000), dtype=torch.uint8, generator=generator),
               "positions": torch.arange(9, dtype=torch.int64)}
    path = tmp_path / "w.safetensors"
    save_aligned(tensors, path)
    return path, tensors


def test_packed_tensors_are_read_onto_huge_pages(tmp_path, huge_pages_lent):
    path, written = _weights(tmp_path)
    loaded = load_file(str(path))
    placed = weights_on_huge_pages(path, loaded)
    assert list(placed) == list(loaded)
    for name, tensor in written.items():
        assert placed[name].dtype == tensor.dtype and placed[name].shape == tensor.shape
        assert torch.equal(placed[name], tensor)
    assert placed["embedding"] is loaded["embedding"]
    integers = ("layers.0.packed", "layers.1.packed", "positions")
    assert all(placed[name].data_ptr() != loaded[name].data_ptr() for name in integers)
    assert all(placed[name].data_ptr() % 64 == 0 for name in integers)


def test_floating_point_tensors_named_are_read_too(tmp_path, huge_pages_lent):
    path, written = _weights(tmp_path)
    loaded = load_file(str(path))
    placed = weights_on_huge_pages(path, loaded, floats={"embedding"})
    assert torch.equal(placed["embedding"], written["embedding"]) and placed["embedding"].dtype == torch.bfloat16
    assert placed["embedding"].data_ptr() != loaded["embedding"].data_ptr()
    assert placed["embedding"].data_ptr() % 64 == 0


def test_nothing_moves_where_huge_pages_are_not_lent(tmp_path, huge_pages_lent):
    huge_pages_lent.write_text("always madvise [never]")
    path, _ = _weights(tmp_path)
    loaded = load_file(str(path))
    assert all(placed is loaded[name] for name, placed in weights_on_huge_pages(path, loaded).items())


def test_offsets_point_at_each_tensors_bytes(tmp_path):
    path, written = _weights(tmp_path)
    data = path.read_bytes()
    for name, start in tensor_offsets(path).items():
        tensor = written[name]
        assert data[start:start + tensor.numel() * tensor.element_size()] == tensor.view(torch.uint8).numpy().tobytes()


def test_an_engine_on_huge_pages_decodes_what_it_does_in_place(tmp_path, huge_pages_lent, monkeypatch):
    """A tiny q4 engine, its packed weights and caches placed as on huge pages (pages of 4 KiB here, so that
    its small tensors move), generates the tokens it generates reading its file in place."""
    from specc.cli.main import main
    from specc.engine.loaded import load_engine
    from specc.host import huge_pages
    from specc.testing.checkpoints import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model")
    engine = tmp_path / "engine"
    assert main(["compile", str(checkpoint), "--method", "none", "--backend", "eager", "--dtype", "bfloat16",
                 "--quantize", "q4", "--max-seq-len", "64", "-o", str(engine)]) == 0
    small_page = tmp_path / "small-page"
    small_page.write_text("4096\n")
    monkeypatch.setattr(huge_pages, "PAGE_SIZE", small_page)
    placed = load_engine(engine, device="cpu")
    caches = placed.runtime.target.cache.tensors
    assert caches[1].data_ptr() - caches[0].data_ptr() == caches[0].numel() * caches[0].element_size()
    monkeypatch.setenv(huge_pages.ENV_VAR, "0")
    in_place = load_engine(engine, device="cpu")
    prompt = placed.encode("w5 w6 w7")
    assert placed.generate_ids(prompt, 16).token_ids == in_place.generate_ids(prompt, 16).token_ids


def test_an_eager_float_engine_streams_its_layers_from_huge_pages_and_looks_its_table_up_in_place(
        tmp_path, huge_pages_lent, monkeypatch):
    """Its layers' weights are read onto (here 4 KiB) pages of their own, its untied embedding table
    stays mapped from the file, and it decodes what it decodes with everything in place."""
    from specc.cli.main import main
    from specc.engine.loaded import load_engine
    from specc.graph.serialize import graph_attributes
    from specc.host import huge_pages
    from specc.testing.checkpoints import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model")
    engine = tmp_path / "engine"
    assert main(["compile", str(checkpoint), "--method", "none", "--max-seq-len", "64", "-o", str(engine)]) == 0
    small_page = tmp_path / "small-page"
    small_page.write_text("4096\n")
    monkeypatch.setattr(huge_pages, "PAGE_SIZE", small_page)
    placed = load_engine(engine, device="cpu")
    monkeypatch.setenv(huge_pages.ENV_VAR, "0")
    in_place = load_engine(engine, device="cpu")
    moved = graph_attributes(placed.context.modules["target"])
    mapped = graph_attributes(in_place.context.modules["target"])
    table = next(name for name in moved if name.endswith("embed_tokens.weight"))
    layer = next(name for name in moved if name.endswith("layers.0.mlp.down_proj.weight"))
    weights_file = str(engine / "weights" / "target.safetensors")
    assert _mapped_file(moved[table].data_ptr()) == weights_file == _mapped_file(mapped[layer].data_ptr())
    assert _mapped_file(moved[layer].data_ptr()) == ""   # anonymous memory: the buffer
    prompt = placed.encode("w5 w6 w7")
    assert placed.generate_ids(prompt, 16).token_ids == in_place.generate_ids(prompt, 16).token_ids


def _mapped_file(address: int) -> str:
    """The file the mapping of this process holding `address` maps ("" for anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < end:
            return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"no mapping holds {address:#x}")
