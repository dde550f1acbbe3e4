"""Train Kangaroo's adapter at compile time, on the rewritten graphs themselves.

Teacher: the frozen target as the program runs it, `shallow` then `deep`
on a window of tokens, giving the exit states and the full model's next-
token distribution. Student: the `adapter` graph on those exit states,
with its own KV cache, exactly as it drafts. Only the adapter's parameters
move; the shared LM head and every target weight stay frozen.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from specc.graph.nodes import layer_index
from specc.passes.attach_adapter_head import AdapterHeadConfig
from specc.program import SpeculativeProgram
from specc.runtime.masks import causal_chunk_mask
from specc.train.corpus import token_windows
from specc.train.distill import DistillConfig, distill

ADAPTER_MODULE = AdapterHeadConfig().module_name


def train_adapter(program: SpeculativeProgram, config, tokenizer) -> dict:
    """The adapter's weights by name, plus `method_state` with the training report."""
    shallow, deep, adapter = (program.graphs[name].module for name in ("shallow", "deep", "adapter"))
    arch = program.graphs["shallow"].architecture
    parameters = adapter_parameters(adapter)
    for name, p in adapter.named_parameters():
        if name not in parameters:
            p.requires_grad_(False)   # the target (and its LM head) is frozen
    state = {"exit_layer": len({i for i in map(layer_index, shallow.graph.nodes) if i is not None}),
             "training": None}
    if config.train_steps > 0:
        windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, config.train_steps,
                                config.eval_sequences, config.seed)
        dtype = next(iter(parameters.values())).dtype
        report = distill(_student(adapter, arch, dtype), _teacher(shallow, deep, arch, dtype),
                         list(parameters.values()), windows.train, windows.heldout,
                         DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                       warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                                       grad_clip=config.grad_clip, eval_every=config.eval_every,
                                       seed=config.seed),
                         description="kangaroo: training adapter")
        tqdm.write(f"kangaroo: adapter trained on {windows.source}: {report.summary()}")
        state.update(calibration=windows.source, training=report.to_json())
    return {**{name: p.detach().clone() for name, p in parameters.items()}, "method_state": state}


def adapter_parameters(adapter: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in adapter.named_parameters() if name.startswith(ADAPTER_MODULE + ".")}


def _teacher(shallow, deep, arch, dtype):
    """tokens → (the target's next-token probabilities [T, V], the exit states [1, T, H])."""
    def teach(tokens: torch.Tensor):
        inputs = _decoding_inputs(tokens)
        caches = _caches(arch, arch.num_layers, tokens.numel(), dtype)
        (exits,) = shallow(*inputs, *caches)
        (logits,) = deep(*inputs, *caches, exits)
        return torch.softmax(logits[0].float(), dim=-1), (tokens, exits)
    return teach


def _student(adapter, arch, dtype):
    """(tokens, exit states) → the adapter's logits [T, V], its cache starting empty."""
    def predict(lesson) -> torch.Tensor:
        tokens, exits = lesson
        (logits,) = adapter(*_decoding_inputs(tokens), *_caches(arch, 1, tokens.numel(), dtype), exits)
        return logits[0]
    return predict


def _decoding_inputs(tokens: torch.Tensor) -> tuple:
    positions = torch.arange(tokens.numel())
    return tokens[None], positions[None], causal_chunk_mask(0, tokens.numel()), positions


def _caches(arch, layers: int, length: int, dtype) -> list[torch.Tensor]:
    shape = (1, arch.num_key_value_heads, length + 1, arch.head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * layers)]
