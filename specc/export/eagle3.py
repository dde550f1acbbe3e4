"""An `eagle` engine's draft head as the EAGLE-3 checkpoint vLLM's and SGLang's loaders read.

Both serving stacks load an EAGLE-3 draft as `LlamaForCausalLMEagle3`: one Llama
decoder layer (`midlayer.*`) whose q/k/v read `cat([input_layernorm(embed),
hidden_norm(hidden)])` (2H wide), `fc` fusing three target hidden states into H,
a final `norm`, and an `lm_head` over a draft vocabulary whose row i is target
token `i + d2t[i]` (`t2d` marks the target ids the draft can propose). The
embedding is not stored: both loaders share the target's. The layout and every
rule below was read from the loaders' source, never run; the files and lines are
in docs/export.md (vLLM 0.33.0 `model_executor/models/llama_eagle3.py`, SGLang
0.5.23 `srt/models/llama_eagle3.py`, SafeAILab/EAGLE `eagle/traineagle3/cnets.py`).

Rules that shape the export:
- rows are written in ascending target-id order, EAGLE's training layout (its
  `scandata` sorts the kept ids, and training reads the target's logits through
  the `t2d` mask, which yields them in id order); the loaders themselves only
  scatter through `d2t`, so the order changes no served result;
- a head over the whole vocabulary carries no `d2t`/`t2d`: vLLM 0.33 registers no
  `draft_id_to_target_id` then, and a `d2t` tensor would fail its load;
- q/k/v biases (Qwen2) need `attention_bias: true`, under which vLLM and SGLang
  also build an o_proj bias, so a zero one is written; SGLang 0.5.23's draft
  layer has no q/k/v bias and skips those tensors (a warning says so);
- q/k norms (Qwen3) and fused qkv/gate_up projections (Phi-3) have no place in the
  loaders' Llama draft layer, so such engines are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specc.errors import SpeccError, UsageError
from specc.export.engine_files import EngineFiles

METHOD = "eagle"
PREFIX = "eagle."            # the EAGLE-3 layer's tensors (trained ones in weights/added.safetensors)
DRAFT_HEAD = "draft_head.weight"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")   # separate q/k/v and gate/up/down projections
FUSED_STATES = 3             # fc fuses the hidden states entering three target layers (low, mid, high)
QKV_BIASES = tuple(f"midlayer.self_attn.{p}_proj.bias" for p in "qkv")
O_PROJ_BIAS = "midlayer.self_attn.o_proj.bias"
ROTARY_BUFFER = "rotary_emb.inv_freq"   # derived from rope_theta; every loader computes its own


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def layer_shapes(d: Dims) -> dict[str, tuple[int, ...]]:
    """The fused-feature layer's tensors, by the names the loaders read, and their shapes."""
    h, q, kv, i = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate
    return {
        "fc.weight": (h, FUSED_STATES * h),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
    }


def bias_shapes(d: Dims) -> dict[str, tuple[int, ...]]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    return dict(zip(QKV_BIASES, ((q,), (kv,), (kv,))))


@dataclass
class Eagle3Draft:
    """What the checkpoint holds: `tensors` by their EAGLE-3 names, and the facts its config needs."""

    tensors: dict[str, torch.Tensor]
    dims: Dims
    num_target_layers: int
    fused_layers: list[int]
    draft_vocab_size: int
    attention_bias: bool
    warnings: list[str] = field(default_factory=list)


def eagle3_draft(engine: EngineFiles) -> Eagle3Draft:
    _check_method(engine)
    arch = engine.target_architecture()
    _check_family(arch, engine)
    layer = {name[len(PREFIX):]: engine.tensor(name) for name in sorted(engine.names())
             if name.startswith(PREFIX) and not name.endswith(ROTARY_BUFFER)}
    _refuse_foreign_layouts(layer, engine)
    dims = _dims(arch, layer, engine)
    tensors = _layer_tensors(layer, dims, engine)
    biases, warnings = _biases(layer, dims, engine)
    tensors |= biases
    tensors |= _draft_head(engine, dims)
    fused = _fused_layers(engine, arch["num_layers"])
    tensors = {name: t if not t.is_floating_point() else t.to(engine.dtype).contiguous()
               for name, t in tensors.items()}
    return Eagle3Draft(tensors, dims, arch["num_layers"], fused, tensors["lm_head.weight"].shape[0],
                       attention_bias=bool(biases), warnings=warnings)


def _check_method(engine: EngineFiles) -> None:
    if engine.method != METHOD:
        raise UsageError(
            f"{engine.path} was compiled with method {engine.method!r}; only engines of method {METHOD!r} export "
            f"to eagle3 (an EAGLE-3 draft checkpoint is the trained EAGLE-3 head such an engine holds): compile "
            f"one with `specc compile MODEL --method {METHOD} -o DIR`")


def _check_family(arch: dict, engine: EngineFiles) -> None:
    model_type = arch.get("model_type")
    if model_type == "phi3":
        raise UsageError(
            f"{engine.path}: its target is phi3, whose attention and MLP use fused qkv_proj/gate_up_proj; the "
            f"EAGLE-3 loaders' Llama draft layer reads separate q/k/v and gate/up projections, so eagle3 export "
            f"supports {', '.join(FAMILIES)} targets only")
    if model_type not in FAMILIES:
        raise UsageError(f"{engine.path}: eagle3 export supports {', '.join(FAMILIES)} targets, not {model_type!r}")


def _refuse_foreign_layouts(layer: dict[str, torch.Tensor], engine: EngineFiles) -> None:
    norms = [n for n in layer if n.startswith(("midlayer.self_attn.q_norm.", "midlayer.self_attn.k_norm."))]
    if norms:
        raise UsageError(
            f"{engine.path}: its EAGLE-3 layer has q/k norms ({', '.join(PREFIX + n for n in norms)}), as Qwen3 "
            f"attention does; the EAGLE-3 loaders' Llama draft (vLLM and SGLang `LlamaForCausalLMEagle3`) has no "
            f"q/k norms, so this head cannot be exported: train the eagle head without q/k norms to serve it there")
    fused = [n for n in layer if n.endswith(("qkv_proj.weight", "gate_up_proj.weight"))]
    if fused:
        raise UsageError(
            f"{engine.path}: its EAGLE-3 layer uses fused projections ({', '.join(PREFIX + n for n in fused)}); "
            f"the EAGLE-3 checkpoint layout stores separate q/k/v and gate/up projections")


def _dims(arch: dict, layer: dict[str, torch.Tensor], engine: EngineFiles) -> Dims:
    gate = layer.get("midlayer.mlp.gate_proj.weight")
    if gate is None or gate.dim() != 2:
        raise SpeccError(f"{engine.path}: the engine stores no 2-d {PREFIX}midlayer.mlp.gate_proj.weight; the eagle "
                         f"engine is incomplete, recompile it")
    return Dims(hidden=arch["hidden_size"], heads=arch["num_attention_heads"], kv_heads=arch["num_key_value_heads"],
                head_dim=arch["head_dim"], intermediate=gate.shape[0], vocab=arch["vocab_size"])


def _layer_tensors(layer: dict[str, torch.Tensor], dims: Dims, engine: EngineFiles) -> dict[str, torch.Tensor]:
    expected = layer_shapes(dims)
    known = set(expected) | set(bias_shapes(dims))
    unknown = sorted(set(layer) - known)
    if unknown:
        raise SpeccError(
            f"{engine.path}: the engine has {PREFIX}* tensors the EAGLE-3 layout has no place for: "
            f"{', '.join(PREFIX + n for n in unknown)} (it holds {', '.join(PREFIX + n for n in expected)} and "
            f"optional q/k/v biases); this specc cannot export the engine without dropping trained weights")
    missing = [PREFIX + n for n in expected if n not in layer]
    if missing:
        raise SpeccError(f"{engine.path}: the engine stores no {', '.join(missing)}; the eagle engine is "
                         f"incomplete, recompile it")
    for name, shape in expected.items():
        _check_shape(PREFIX + name, layer[name], shape, engine)
    return {name: layer[name] for name in expected}


def _biases(layer: dict[str, torch.Tensor], dims: Dims,
            engine: EngineFiles) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The q/k/v biases (none, or all three) with the zero o_proj bias `attention_bias` implies."""
    present = [n for n in QKV_BIASES if n in layer]
    if not present:
        return {}, []
    if len(present) != len(QKV_BIASES):
        raise SpeccError(f"{engine.path}: the EAGLE-3 layer has {', '.join(PREFIX + n for n in present)} but not all "
                         f"of q/k/v biases; the eagle engine is inconsistent, recompile it")
    for name, shape in bias_shapes(dims).items():
        _check_shape(PREFIX + name, layer[name], shape, engine)
    if all(not layer[n].any() for n in QKV_BIASES):
        return {}, []   # all zero: the layer without biases computes the same
    biases = {n: layer[n] for n in QKV_BIASES}
    biases[O_PROJ_BIAS] = torch.zeros(dims.hidden, dtype=layer[QKV_BIASES[0]].dtype)
    return biases, [
        "the draft layer has q/k/v biases: config.json sets attention_bias=true (vLLM builds q/k/v biases from it, "
        "llama_eagle3.py:85-93; it and SGLang then also expect an o_proj bias, written as zeros). SGLang 0.5.23's "
        "LlamaForCausalLMEagle3 builds qkv_proj without a bias (llama_eagle3.py:67-75) and skips these tensors, so "
        "under SGLang the head drafts without them: still lossless, but fewer drafts are accepted"]


def _draft_head(engine: EngineFiles, dims: Dims) -> dict[str, torch.Tensor]:
    """`lm_head.weight` in ascending target-id order, with `d2t`/`t2d` for a reduced vocabulary."""
    vocabulary = engine.method_state.get("draft_vocabulary")
    if vocabulary is None:
        head = engine.tensor(DRAFT_HEAD)
        if head is None:
            head = engine.tensor("lm_head.weight")
        if head is None:
            head = engine.tensor("model.embed_tokens.weight")   # tied embeddings
        if head is None:
            raise SpeccError(f"{engine.path}: the engine has no {DRAFT_HEAD}, and the target has neither "
                             f"lm_head.weight nor model.embed_tokens.weight; recompile it")
        _check_shape("the full-vocabulary draft head", head, (dims.vocab, dims.hidden), engine)
        return {"lm_head.weight": head}
    ids = _checked_vocabulary(vocabulary, dims.vocab, engine)
    head = engine.tensor(DRAFT_HEAD)
    if head is None:
        raise SpeccError(f"{engine.path}: method_state has a draft_vocabulary but the engine stores no "
                         f"{DRAFT_HEAD}; the eagle engine is incomplete, recompile it")
    _check_shape(DRAFT_HEAD, head, (len(ids), dims.hidden), engine)
    order = torch.argsort(ids)
    ids, head = ids[order], head[order]
    if len(ids) == dims.vocab:
        return {"lm_head.weight": head}   # every token, now in id order: row i is token i
    t2d = torch.zeros(dims.vocab, dtype=torch.bool)
    t2d[ids] = True
    return {"lm_head.weight": head, "d2t": ids - torch.arange(len(ids)), "t2d": t2d}


def _checked_vocabulary(vocabulary, vocab: int, engine: EngineFiles) -> torch.Tensor:
    if not isinstance(vocabulary, list) or not vocabulary or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in vocabulary):
        raise SpeccError(f"{engine.path}: method_state.draft_vocabulary must be a non-empty list of token ids")
    ids = torch.tensor(vocabulary, dtype=torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise SpeccError(f"{engine.path}: method_state.draft_vocabulary has ids outside the target's vocabulary "
                         f"[0, {vocab})")
    if len(torch.unique(ids)) != len(ids):
        raise SpeccError(f"{engine.path}: method_state.draft_vocabulary repeats token ids; each row of the draft "
                         f"head must be a distinct token")
    return ids


def _fused_layers(engine: EngineFiles, num_layers: int) -> list[int]:
    """The target layers whose input hidden states `fc` fuses, checked against what both loaders
    can capture: three distinct layers in increasing order (the loaders collect them walking the
    layers, and fc's column blocks are low, mid, high), each the input of a layer after the first
    (layer 0's input, the embedding, is SGLang id -1, a capture no loader documents)."""
    layers = engine.method_state.get("fused_layers")
    if not (isinstance(layers, list) and len(layers) == FUSED_STATES
            and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise SpeccError(f"{engine.path}: method_state.fused_layers must list the {FUSED_STATES} target layers whose "
                         f"input hidden states the head fuses, got {layers!r}; recompile the engine")
    if layers != sorted(set(layers)):
        raise SpeccError(
            f"{engine.path}: method_state.fused_layers {layers} must be {FUSED_STATES} distinct layers in increasing "
            f"order: the loaders capture each layer once, walking the layers, so fc's low/mid/high blocks must "
            f"follow layer order")
    if layers[0] < 1 or layers[-1] >= num_layers:
        raise SpeccError(f"{engine.path}: method_state.fused_layers {layers} must be layers 1..{num_layers - 1} "
                         f"of the {num_layers}-layer target (the state entering each)")
    return layers


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], engine: EngineFiles) -> None:
    if tuple(tensor.shape) != shape:
        raise SpeccError(f"{engine.path}: {name} has shape {list(tensor.shape)}, but the target's architecture "
                         f"implies {list(shape)}; the eagle engine is inconsistent, recompile it")
