"""`specc export --format eagle3` on a synthetic `eagle` engine: the checkpoint's names and shapes
against the loaders' source, its config, the d2t/t2d vocabulary mapping, the refusals, atomicity.

No `eagle` method is needed: the engine is written here as `specc compile --method eagle` will
write one (a manifest with its checksums, weights/target.safetensors, weights/added.safetensors),
from the contract in specc/export/eagle3.py. Line numbers cite the release sources named in
docs/export.md: vLLM 0.33.0 (`vllm/...`), SGLang 0.5.23 (`sglang/srt/...`), SafeAILab/EAGLE
cb7e0841 (`eagle/...`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specc.cli.main import main
from specc.engine.save import write_manifest
from specc.errors import SpeccError, UsageError
from specc.export import ExportRequest, export_engine

H, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB, LAYERS = 16, 4, 2, 8, 24, 50, 6
FUSED = [1, 3, 4]
DRAFT_VOCABULARY = [7, 3, 41, 0, 19, 22, 8, 49, 30, 12]   # frequency order, not id order
SOURCE_CONFIG = {"model_type": "llama", "hidden_size": H, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
                 "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "intermediate_size": 40,
                 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 4096,
                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
                 "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}

# What the exported model.safetensors must hold, by the names both loaders read (N = 10 draft tokens).
# vLLM llama_eagle3.py:443-444 prefixes every name but lm_head with "model." and :291 maps
# "midlayer." to "layers.0."; SGLang llama_eagle3.py:338-348 maps "midlayer" to "layers.0" and
# :362/:372 prefix "model.". Shapes: fc 3H -> H (vLLM :218-250, SGLang :156-167; EAGLE
# traineagle3/cnets.py:501); q/k/v read cat([embed, hidden]), 2H wide (vLLM :82-96, SGLang :62-75);
# lm_head over the draft vocabulary (vLLM :329-334, SGLang :309-314); d2t [N] int64 and t2d [V]
# bool as EAGLE registers them (eagle/model/cnets.py:538-541). No embed_tokens: both share the
# target's (vLLM v1/spec_decode/llm_base_proposer.py:1438-1440, SGLang eagle_worker_v2.py:353-363).
EXPECTED = {
    "fc.weight": ((H, 3 * H), torch.float32),
    "midlayer.input_layernorm.weight": ((H,), torch.float32),
    "midlayer.hidden_norm.weight": ((H,), torch.float32),
    "midlayer.self_attn.q_proj.weight": ((HEADS * HEAD_DIM, 2 * H), torch.float32),
    "midlayer.self_attn.k_proj.weight": ((KV_HEADS * HEAD_DIM, 2 * H), torch.float32),
    "midlayer.self_attn.v_proj.weight": ((KV_HEADS * HEAD_DIM, 2 * H), torch.float32),
    "midlayer.self_attn.o_proj.weight": ((H, HEADS * HEAD_DIM), torch.float32),
    "midlayer.post_attention_layernorm.weight": ((H,), torch.float32),
    "midlayer.mlp.gate_proj.weight": ((INTERMEDIATE, H), torch.float32),
    "midlayer.mlp.up_proj.weight": ((INTERMEDIATE, H), torch.float32),
    "midlayer.mlp.down_proj.weight": ((H, INTERMEDIATE), torch.float32),
    "norm.weight": ((H,), torch.float32),
    "lm_head.weight": ((len(DRAFT_VOCABULARY), H), torch.float32),
    "d2t": ((len(DRAFT_VOCABULARY),), torch.int64),
    "t2d": ((VOCAB,), torch.bool),
}


def eagle_layer(generator: torch.Generator, qkv_bias: bool = False) -> dict[str, torch.Tensor]:
    def rand(*shape):
        return torch.randn(*shape, generator=generator) * 0.2
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layer = {"fc.weight": rand(H, 3 * H), "midlayer.input_layernorm.weight": 1 + rand(H),
             "midlayer.hidden_norm.weight": 1 + rand(H), "midlayer.self_attn.q_proj.weight": rand(q, 2 * H),
             "midlayer.self_attn.k_proj.weight": rand(kv, 2 * H), "midlayer.self_attn.v_proj.weight": rand(kv, 2 * H),
             "midlayer.self_attn.o_proj.weight": rand(H, q), "midlayer.post_attention_layernorm.weight": 1 + rand(H),
             "midlayer.mlp.gate_proj.weight": rand(INTERMEDIATE, H),
             "midlayer.mlp.up_proj.weight": rand(INTERMEDIATE, H),
             "midlayer.mlp.down_proj.weight": rand(H, INTERMEDIATE), "norm.weight": 1 + rand(H)}
    if qkv_bias:
        layer |= {"midlayer.self_attn.q_proj.bias": rand(q), "midlayer.self_attn.k_proj.bias": rand(kv),
                  "midlayer.self_attn.v_proj.bias": rand(kv)}
    return {f"eagle.{name}": t for name, t in layer.items()}


def make_engine(root: Path, *, method: str = "eagle", model_type: str = "llama", draft_vocabulary=DRAFT_VOCABULARY,
                fused_layers=FUSED, tied: bool = False, qkv_bias: bool = False, added_extra: dict | None = None,
                source_config: dict | None = SOURCE_CONFIG, dtype: torch.dtype = torch.float32,
                untrained: tuple[str, ...] = ()) -> Path:
    """An engine directory as `specc compile --method eagle` writes one (graphs and IR left out:
    export reads neither). `untrained` names go to the target's file, where the engine writer puts
    parameters a pass added but training did not return."""
    generator = torch.Generator().manual_seed(0)
    engine = root / "engine"
    (engine / "weights").mkdir(parents=True)
    embed = torch.randn(VOCAB, H, generator=generator)
    target = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(H),
              "model.rotary_emb.inv_freq": torch.ones(HEAD_DIM // 2)}
    if not tied:
        target["lm_head.weight"] = torch.randn(VOCAB, H, generator=generator)
    added = eagle_layer(generator, qkv_bias)
    if draft_vocabulary is not None:
        added["draft_head.weight"] = torch.randn(len(draft_vocabulary), H, generator=generator)
    added |= added_extra or {}
    target |= {name: added.pop(name) for name in untrained}
    save_file({k: v.to(dtype) for k, v in target.items()}, str(engine / "weights" / "target.safetensors"))
    save_file({k: v.to(dtype) for k, v in added.items()}, str(engine / "weights" / "added.safetensors"))
    checkpoint = root / "checkpoint"
    checkpoint.mkdir()
    if source_config is not None:
        (checkpoint / "config.json").write_text(json.dumps({**source_config, "model_type": model_type}))
    architecture = {"model_type": model_type, "num_layers": LAYERS, "hidden_size": H, "num_attention_heads": HEADS,
                    "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
                    "eos_token_ids": [2], "sliding_window": None}
    state = {"fused_layers": fused_layers, **({"draft_vocabulary": draft_vocabulary} if draft_vocabulary else {})}
    write_manifest(engine, {
        "method": method, "method_config": {"version": 1}, "backend": "eager", "dtype": str(dtype).split(".")[1],
        "max_seq_len": 64, "lossless": True, "device": "cpu", "source_checkpoint": str(checkpoint), "passes": [],
        "method_state": state,
        "graphs": {"target": {"source": "target", "weights": "weights/target.safetensors",
                              "architecture": architecture, "inputs": [], "signature": {}}},
        "weight_aliases": {"target": {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}},
    })
    return engine


def exported(directory: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def engine_tensors(engine: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(engine / "weights" / "added.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def export(engine: Path, output: Path, **kwargs):
    return export_engine(ExportRequest(engine=engine, output=output, **kwargs))


def test_exported_names_and_shapes_match_the_loaders(tmp_path):
    engine = make_engine(tmp_path)
    report = export(engine, tmp_path / "out")
    tensors = exported(tmp_path / "out")
    assert {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()} == EXPECTED
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert report.draft_vocab_size == len(DRAFT_VOCABULARY) and report.fused_layers == FUSED and not report.warnings


def vllm_parameter(name: str) -> tuple[str, object] | None:
    """vLLM 0.33's Eagle3LlamaForCausalLM.load_weights name path: (parameter, shard) or None if skipped."""
    if "t2d" in name:                                    # llama_eagle3.py:426-427
        return None
    if "d2t" in name:                                    # :428-429
        return name.replace("d2t", "draft_id_to_target_id"), None
    if "lm_head" not in name:                            # :443-444
        name = "model." + name
    name = name.replace("midlayer.", "layers.0.")         # :291
    for shard, (fused, shard_id) in {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"),   # :292-298
                                     ".v_proj": (".qkv_proj", "v"), ".gate_proj": (".gate_up_proj", 0),
                                     ".up_proj": (".gate_up_proj", 1)}.items():
        if shard in name:
            return name.replace(shard, fused), shard_id
    return name, None


def vllm_parameters(draft_vocab: int) -> dict[str, tuple[int, ...]]:
    """The parameters vLLM 0.33 builds for this config (embed_tokens is replaced by the target's)."""
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    params = {"model.fc.weight": (H, 3 * H),                                              # :242-250
              "model.layers.0.self_attn.qkv_proj.weight": (qkv, 2 * H),                   # :88-96
              "model.layers.0.self_attn.o_proj.weight": (H, HEADS * HEAD_DIM),
              "model.layers.0.mlp.gate_up_proj.weight": (2 * INTERMEDIATE, H),
              "model.layers.0.mlp.down_proj.weight": (H, INTERMEDIATE),
              "model.layers.0.input_layernorm.weight": (H,), "model.layers.0.hidden_norm.weight": (H,),  # :98
              "model.layers.0.post_attention_layernorm.weight": (H,), "model.norm.weight": (H,),
              "lm_head.weight": (draft_vocab, H)}                                         # :329-334
    if draft_vocab != VOCAB:                                                              # :339-345
        params["draft_id_to_target_id"] = (draft_vocab,)
    return params


def sglang_parameter(name: str) -> tuple[str, object] | None:
    """SGLang 0.5.23's LlamaForCausalLMEagle3.load_weights name path (d2t becomes hot_token_id)."""
    name = name.replace("midlayer", "layers.0")          # llama_eagle3.py:338-348
    if "d2t" in name or "t2d" in name:                   # :350-356
        return None
    for shard, (fused, shard_id) in {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"),   # :328-335
                                     ".v_proj": (".qkv_proj", "v"), ".gate_proj": (".gate_up_proj", 0),
                                     ".up_proj": (".gate_up_proj", 1)}.items():
        if shard in name:
            name = name.replace(shard, fused)
            return (name if name == "lm_head.weight" else f"model.{name}"), shard_id   # :362
    return (name if name == "lm_head.weight" else f"model.{name}"), None               # :372


@pytest.mark.parametrize("draft_vocabulary", [DRAFT_VOCABULARY, None], ids=["reduced", "full"])
def test_every_exported_tensor_lands_on_a_loader_parameter_and_fills_it(tmp_path, draft_vocabulary):
    export(make_engine(tmp_path, draft_vocabulary=draft_vocabulary), tmp_path / "out")
    tensors = exported(tmp_path / "out")
    n = tensors["lm_head.weight"].shape[0]
    vllm = vllm_parameters(n)
    sglang = {name: shape for name, shape in vllm.items() if name != "draft_id_to_target_id"}
    for route, params in ((vllm_parameter, vllm), (sglang_parameter, sglang)):
        rows: dict[str, int] = {}
        for name, tensor in tensors.items():
            mapped = route(name)
            if mapped is None:
                continue
            param, shard = mapped
            assert param in params, (route.__name__, name, param)
            if shard is None:
                assert tuple(tensor.shape) == params[param], (name, param)
            else:   # shards stack along dim 0 into the fused projection
                assert tensor.shape[1:] == params[param][1:]
            rows[param] = rows.get(param, 0) + tensor.shape[0]
        assert {p: rows[p] for p in rows} == {p: s[0] for p, s in params.items()}, route.__name__
    if draft_vocabulary is not None:   # SGLang reads d2t as hot_token_id = d2t + arange (llama_eagle3.py:352)
        assert torch.equal(tensors["d2t"] + torch.arange(n), torch.tensor(sorted(DRAFT_VOCABULARY)))


def test_d2t_and_t2d_map_draft_rows_to_the_same_target_tokens(tmp_path):
    engine = make_engine(tmp_path)
    export(engine, tmp_path / "out")
    tensors, trained = exported(tmp_path / "out"), engine_tensors(engine)
    d2t, t2d, head = tensors["d2t"], tensors["t2d"], tensors["lm_head.weight"]
    targets = torch.arange(len(d2t)) + d2t        # target = i + d2t[i] (vLLM llama_eagle3.py:385-386)
    assert targets.tolist() == sorted(DRAFT_VOCABULARY)   # ascending ids, EAGLE cnets.py:672-674
    assert torch.nonzero(t2d).flatten().tolist() == targets.tolist()
    for row, token in enumerate(targets.tolist()):
        assert torch.equal(head[row], trained["draft_head.weight"][DRAFT_VOCABULARY.index(token)])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def one_token_logits(t: dict[str, torch.Tensor], embed: torch.Tensor, fused: torch.Tensor) -> torch.Tensor:
    """The EAGLE-3 draft layer on the first token of a sequence (attention over one key is its value),
    as vLLM's Eagle3 forward computes it (llama_eagle3.py:124-151, 275-288)."""
    hidden = fused @ t["fc.weight"].T
    x = torch.cat([rms_norm(embed, t["midlayer.input_layernorm.weight"]),
                   rms_norm(hidden, t["midlayer.hidden_norm.weight"])])
    v = x @ t["midlayer.self_attn.v_proj.weight"].T
    attention = v.view(KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, dim=0).flatten()
    hidden = hidden + attention @ t["midlayer.self_attn.o_proj.weight"].T
    y = rms_norm(hidden, t["midlayer.post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(y @ t["midlayer.mlp.gate_proj.weight"].T) * (y @ t["midlayer.mlp.up_proj.weight"].T)
    hidden = hidden + mlp @ t["midlayer.mlp.down_proj.weight"].T
    return rms_norm(hidden, t["norm.weight"]) @ t["lm_head.weight"].T


def test_served_logits_over_the_target_vocabulary_match_the_engines_head(tmp_path):
    engine = make_engine(tmp_path)
    export(engine, tmp_path / "out")
    tensors, trained = exported(tmp_path / "out"), engine_tensors(engine)
    generator = torch.Generator().manual_seed(1)
    embed, fused = torch.randn(H, generator=generator), torch.randn(3 * H, generator=generator)
    draft = one_token_logits(tensors, embed, fused)
    served = torch.full((VOCAB,), float("-inf"))
    served[torch.arange(len(draft)) + tensors["d2t"]] = draft   # vLLM compute_logits, llama_eagle3.py:385-394
    ours = {name.removeprefix("eagle."): t for name, t in trained.items()}
    ours["lm_head.weight"] = trained["draft_head.weight"]
    engine_draft = one_token_logits(ours, embed, fused)
    expected = torch.full((VOCAB,), float("-inf"))
    expected[torch.tensor(DRAFT_VOCABULARY)] = engine_draft     # engine row i is draft_vocabulary[i]
    torch.testing.assert_close(served, expected)


def test_config_holds_what_the_loaders_read(tmp_path):
    from transformers import AutoConfig

    export(make_engine(tmp_path), tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]   # vLLM registry.py:702, SGLang EntryClass
    expected = {"model_type": "llama", "hidden_size": H, "intermediate_size": INTERMEDIATE,
                "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
                "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "rope_scaling": SOURCE_CONFIG["rope_scaling"], "max_position_embeddings": 4096,
                "attention_bias": False, "vocab_size": VOCAB, "draft_vocab_size": len(DRAFT_VOCABULARY),
                "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
                # vLLM: the stream entering layer j (gpu_model_runner.py:5207, interfaces.py:1640-1649);
                # SGLang: nested, output of layer j, captured at j + 1 (spec_aux_hidden_state.py:185-196,
                # llama.py:929-941)
                "eagle_aux_hidden_state_layer_ids": FUSED,
                "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 2, 3]}}
    assert {key: config[key] for key in expected} == expected
    loaded = AutoConfig.from_pretrained(tmp_path / "out")   # both loaders parse it with transformers
    assert type(loaded).__name__ == "LlamaConfig"
    assert (loaded.hidden_size, loaded.head_dim, loaded.draft_vocab_size) == (H, HEAD_DIM, len(DRAFT_VOCABULARY))
    assert loaded.eagle_aux_hidden_state_layer_ids == FUSED
    assert loaded.eagle_config["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert loaded.tie_word_embeddings is False


def test_a_transformers_5_source_config_gives_legacy_rope_fields(tmp_path):
    source = {k: v for k, v in SOURCE_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    source["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    export(make_engine(tmp_path, source_config=source), tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["rope_theta"], config["rope_scaling"]) == (1e6, None)


def test_without_a_source_config_export_asks_for_one(tmp_path):
    engine = make_engine(tmp_path, source_config=None)
    with pytest.raises(UsageError, match="--target-config") as caught:
        export(engine, tmp_path / "out")
    assert "rms_norm_eps" in str(caught.value)
    assert not (tmp_path / "out").exists()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(json.dumps(SOURCE_CONFIG))
    export(engine, tmp_path / "out", target_config=tmp_path / "elsewhere")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["rope_theta"] == 500000.0


def test_a_config_of_another_model_is_refused(tmp_path):
    engine = make_engine(tmp_path)
    (tmp_path / "other.json").write_text(json.dumps({**SOURCE_CONFIG, "hidden_size": 2 * H}))
    with pytest.raises(UsageError, match="hidden_size=32"):
        export(engine, tmp_path / "out", target_config=tmp_path / "other.json")


@pytest.mark.parametrize("tied", [False, True])
def test_a_full_vocabulary_head_is_the_targets_and_has_no_d2t(tmp_path, tied):
    engine = make_engine(tmp_path, draft_vocabulary=None, tied=tied)
    export(engine, tmp_path / "out")
    tensors = exported(tmp_path / "out")
    assert "d2t" not in tensors and "t2d" not in tensors   # vLLM :339-345 has no draft_id_to_target_id then
    with safe_open(str(engine / "weights" / "target.safetensors"), framework="pt") as handle:
        head = handle.get_tensor("model.embed_tokens.weight" if tied else "lm_head.weight")
    assert torch.equal(tensors["lm_head.weight"], head)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["draft_vocab_size"] == VOCAB


def test_untrained_head_tensors_are_read_from_the_targets_file(tmp_path):
    untrained = ("draft_head.weight", "eagle.midlayer.input_layernorm.weight", "eagle.norm.weight")
    reference = exported_from(make_engine(tmp_path / "a"), tmp_path / "a" / "out")
    buffer = {"eagle.midlayer.self_attn.rotary_emb.inv_freq": torch.ones(HEAD_DIM // 2)}   # rebuilt from rope_theta
    split = exported_from(make_engine(tmp_path / "b", untrained=untrained, added_extra=buffer), tmp_path / "b" / "out")
    assert split.keys() == reference.keys()
    assert all(torch.equal(split[name], reference[name]) for name in reference)


def exported_from(engine: Path, output: Path) -> dict[str, torch.Tensor]:
    export(engine, output)
    return exported(output)


def test_a_bfloat16_engine_exports_bfloat16(tmp_path):
    export(make_engine(tmp_path, dtype=torch.bfloat16), tmp_path / "out")
    tensors = exported(tmp_path / "out")
    assert tensors["fc.weight"].dtype == torch.bfloat16 and tensors["d2t"].dtype == torch.int64
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_qkv_biases_set_attention_bias_with_a_zero_o_proj_bias_and_warn(tmp_path):
    engine = make_engine(tmp_path, model_type="qwen2", qkv_bias=True)
    report = export(engine, tmp_path / "out")
    tensors = exported(tmp_path / "out")
    trained = engine_tensors(engine)
    assert torch.equal(tensors["midlayer.self_attn.q_proj.bias"], trained["eagle.midlayer.self_attn.q_proj.bias"])
    assert torch.equal(tensors["midlayer.self_attn.o_proj.bias"], torch.zeros(H))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["attention_bias"] is True
    assert len(report.warnings) == 1 and "SGLang" in report.warnings[0]
    assert "SGLang" in (tmp_path / "out" / "README.md").read_text()


def test_zero_qkv_biases_are_left_out(tmp_path):
    zeros = {f"eagle.midlayer.self_attn.{p}_proj.bias": torch.zeros(n * HEAD_DIM)
             for p, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}
    report = export(make_engine(tmp_path, added_extra=zeros), tmp_path / "out")
    assert not any(name.endswith(".bias") for name in exported(tmp_path / "out")) and not report.warnings


def test_qwen3_q_norm_is_refused(tmp_path):
    norm = {"eagle.midlayer.self_attn.q_norm.weight": torch.ones(HEAD_DIM),
            "eagle.midlayer.self_attn.k_norm.weight": torch.ones(HEAD_DIM)}
    with pytest.raises(UsageError, match="no q/k norms"):
        export(make_engine(tmp_path, model_type="qwen3", added_extra=norm), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_phi3_is_refused(tmp_path):
    with pytest.raises(UsageError, match="fused qkv_proj"):
        export(make_engine(tmp_path, model_type="phi3"), tmp_path / "out")


def test_a_fused_qkv_head_is_refused(tmp_path):
    fused = {"eagle.midlayer.self_attn.qkv_proj.weight": torch.zeros(64, 2 * H)}
    with pytest.raises(UsageError, match="fused projections"):
        export(make_engine(tmp_path, added_extra=fused), tmp_path / "out")


def test_a_non_eagle_engine_is_refused(tmp_path):
    with pytest.raises(UsageError, match="method 'none'.*only engines of method 'eagle' export to eagle3"):
        export(make_engine(tmp_path, method="none"), tmp_path / "drafts" / "out")
    assert not (tmp_path / "drafts").exists(), "a refused engine is read before any directory is made"


def test_unknown_trained_tensors_are_refused_not_dropped(tmp_path):
    extra = {"eagle.midlayer.mlp.gate_proj.bias": torch.zeros(INTERMEDIATE)}
    with pytest.raises(SpeccError, match="no place for: eagle.midlayer.mlp.gate_proj.bias"):
        export(make_engine(tmp_path, added_extra=extra), tmp_path / "out")


@pytest.mark.parametrize("layers", [[1, 3], [3, 3, 4], [4, 3, 1], [0, 3, 4], [1, 3, LAYERS]])
def test_fused_layers_the_loaders_cannot_capture_are_refused(tmp_path, layers):
    with pytest.raises(SpeccError, match="fused_layers"):
        export(make_engine(tmp_path, fused_layers=layers), tmp_path / "out")


def test_a_modified_engine_is_refused(tmp_path):
    engine = make_engine(tmp_path)
    with (engine / "weights" / "added.safetensors").open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(SpeccError, match="checksum mismatch"):
        export(engine, tmp_path / "out")


def test_an_existing_output_is_kept_unless_forced(tmp_path):
    engine = make_engine(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(UsageError, match="--force"):
        export(engine, out)
    assert (out / "mine.txt").read_text() == "keep"
    export(engine, out, force=True)
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    export(engine, empty)   # an empty directory is no one's work
    assert (empty / "config.json").is_file()
    with pytest.raises(UsageError, match="would replace the engine"):
        export(engine, engine, force=True)


def test_a_failed_write_leaves_nothing_and_keeps_the_old_output(tmp_path, monkeypatch):
    from specc.export import eagle3_format

    engine = make_engine(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(eagle3_format, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        export(engine, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "engine", "out"]   # no staging left
    with pytest.raises(OSError):
        export(engine, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_cli_exports_and_reports_errors_with_exit_codes(tmp_path, capsys):
    engine = make_engine(tmp_path)
    assert main(["export", str(engine), "--format", "eagle3", "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out and "draft vocabulary 10 of 50 tokens" in captured.out
    assert main(["export", str(engine), "--format", "eagle3", "-o", str(tmp_path / "out")]) == 2
    assert "specc: error: output directory" in capsys.readouterr().err
    none_engine = make_engine(tmp_path / "none", method="none")
    assert main(["export", str(none_engine), "--format", "eagle3", "-o", str(tmp_path / "out2")]) == 2
    assert "only engines of method 'eagle'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["export", str(engine), "--format", "medusa", "-o", str(tmp_path / "out3")])
    assert exited.value.code == 2
