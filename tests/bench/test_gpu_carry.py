"""benchmarks/gpu_carry.py: an engine packed without its target weights is rebuilt byte for byte
from the checkpoint on the other side, or the rebuild stops and names the file."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from tests.bench.scripts import load_benchmark


@pytest.fixture(scope="module")
def packed(checkpoints, tmp_path_factory):
    target, _ = checkpoints("llama")
    root = tmp_path_factory.mktemp("carry")
    engine = root / "none-eager"
    compile_engine(CompileRequest(model=str(target), method="none", output=engine, dtype="bfloat16", max_seq_len=64))
    carry = load_benchmark("gpu_carry")
    carry.pack([engine], target, root / "engines.tar.xz")
    return target, engine, root / "engines.tar.xz", carry


def test_the_archive_leaves_out_the_target_weights_and_unpacks_to_the_same_engine(packed, tmp_path):
    target, engine, archive, carry = packed
    weights = engine / "weights" / "target.safetensors"
    assert archive.stat().st_size < weights.stat().st_size / 4
    (rebuilt,) = carry.unpack(archive, target, tmp_path)
    for path in engine.rglob("*"):
        if path.is_file():
            assert (rebuilt / path.relative_to(engine)).read_bytes() == path.read_bytes(), path
    assert not list(rebuilt.rglob("*.recipe"))
    prompt = [3, 17, 29, 5]
    assert (load_engine(rebuilt).generate_ids(prompt, 8).token_ids
            == load_engine(engine).generate_ids(prompt, 8).token_ids)


def test_a_different_checkpoint_stops_the_rebuild_and_names_the_file(packed, tmp_path):
    target, _, archive, carry = packed
    other = tmp_path / "other"
    other.mkdir()
    tensors = load_file(str(target / "model.safetensors"))
    name = next(k for k, t in tensors.items() if t.dim() == 2)
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(other / "model.safetensors"))
    with pytest.raises(SystemExit, match=r"weights/target.safetensors differs"):
        carry.unpack(archive, other, tmp_path / "out")
    assert not (tmp_path / "out" / "none-eager" / "weights" / "target.safetensors").exists()


def test_a_tensor_the_checkpoint_lacks_travels_inline(packed, tmp_path):
    target, engine, _, carry = packed
    recipe = carry._recipe(engine / "weights" / "target.safetensors", carry._checkpoint_tensors(target),
                           tmp_path / "recipe")
    plan = json.loads((recipe / carry.RECIPE).read_text())["from_checkpoint"]
    inline = load_file(str(recipe / carry.INLINE))
    assert set(inline) == {key for key, source in plan.items() if source is None}
    weights = (engine / "weights" / "target.safetensors").stat().st_size
    assert sum(t.numel() * t.element_size() for t in inline.values()) < weights / 100


def test_rows_copied_from_a_checkpoint_matrix_are_rebuilt_from_it(tmp_path):
    """A draft head over a reduced vocabulary copies rows of the embedding: the recipe names
    the rows instead of carrying them, and the rebuild is byte-identical."""
    import torch

    carry = load_benchmark("gpu_carry")
    generator = torch.Generator().manual_seed(0)
    source = {"embed_tokens.weight": torch.randn(64, 8, generator=generator),
              "proj.weight": torch.randn(8, 8, generator=generator)}
    weights = {"draft_head.weight": source["embed_tokens.weight"][[5, 2, 60, 2]].to(torch.bfloat16),
               "proj.weight": source["proj.weight"].to(torch.bfloat16),
               "trained.weight": torch.randn(4, 8, generator=generator).to(torch.bfloat16)}
    save_file(weights, str(tmp_path / "added.safetensors"))
    recipe = carry._recipe(tmp_path / "added.safetensors", source, tmp_path / "recipe")
    plan = json.loads((recipe / carry.RECIPE).read_text())["from_checkpoint"]
    assert plan == {"draft_head.weight": {"tensor": "embed_tokens.weight", "rows": [5, 2, 60, 2]},
                    "proj.weight": {"tensor": "proj.weight"}, "trained.weight": None}
    carry._rebuild(recipe, source, tmp_path / "rebuilt.safetensors")
    assert (tmp_path / "rebuilt.safetensors").read_bytes() == (tmp_path / "added.safetensors").read_bytes()
