"""Train Kangaroo's adapter at compile time, on the rewritten graphs themselves.

Teacher: the frozen target as the program runs it, `shallow` then `deep`
on a window of tokens, giving the exit states and the full model's next-
token distribution (kept as its top-k, in the draft head's index space).
The teacher runs once per distinct window, several windows a call
(`specc.train.packing`), and is served from memory after that: at 135M
parameters it is most of the cost of a step. Student: the
`adapter` graph on those exit states, with its own KV cache, exactly as it
drafts. Only the adapter's parameters move; the shared LM head, the draft
head's rows and every target weight stay frozen.

Before training, the adapter's LM head is cut to the `draft_vocab_size`
most frequent tokens of the calibration text: the adapter graph is built
again with those ids as state, so its recipe's own `after_training` pass
(`reduce_draft_vocabulary`) cuts it, as it will in the engine; the chosen
ids go to the manifest state.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from specc.graph.nodes import layer_index
from specc.contract.descriptor import TrainingContext, TrainResult
from specc.methods.kangaroo.config import DRAFT_VOCABULARY_KEY
from specc.passes.attach_adapter_head import AdapterHeadConfig
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig
from specc.train.corpus import token_windows
from specc.train.inputs import decoding_inputs, empty_caches
from specc.train.vocabulary import frequent_tokens, student_index
from specc.train.distill import DistillConfig, PackedTeacher, cache_teacher, distill, sparse_target
from specc.train.packing import packed_decoding_inputs, tokens_per_call, unpack

ADAPTER_MODULE = AdapterHeadConfig().module_name


def train_adapter(context: TrainingContext, config, tokenizer) -> TrainResult:
    """The adapter's weights (and the reduced draft head) by name, and the
    training report and draft vocabulary as state."""
    program = context.program
    shallow, deep = program.graphs["shallow"].module, program.graphs["deep"].module
    arch = program.graphs["shallow"].architecture
    state = {"exit_layer": len({i for i in map(layer_index, shallow.graph.nodes) if i is not None}),
             "training": None}
    reduce = 0 < config.draft_vocab_size < arch.vocab_size
    if not reduce and config.train_steps == 0:
        return TrainResult(_trained(program.graphs["adapter"].module), state)
    used = min(config.train_windows, max(config.train_steps, 1))   # the teacher runs on no unused window
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, used,
                            config.eval_sequences, config.seed)
    to_student, extra = None, {}
    if reduce:
        ids = frequent_tokens(windows.train, arch, config.draft_vocab_size)
        program = context.build(config, {DRAFT_VOCABULARY_KEY: ids}, names=("adapter",))
        to_student = student_index(ids, arch.vocab_size)
        head = program.graphs["adapter"].module.get_parameter(f"{DraftVocabularyConfig.module_name}.weight")
        extra = {f"{DraftVocabularyConfig.module_name}.weight": head.detach().clone()}
        state[DRAFT_VOCABULARY_KEY] = ids
    adapter = program.graphs["adapter"].module
    parameters = adapter_parameters(adapter)
    device = next(iter(parameters.values())).device   # the engine's: training runs where it will
    to_student = None if to_student is None else to_student.to(device)
    for name, p in adapter.named_parameters():
        if name not in parameters:
            p.requires_grad_(False)   # the target, its LM head and the draft head are frozen
    if config.train_steps > 0:
        dtype = next(iter(parameters.values())).dtype
        teacher = cache_teacher(window_teacher(shallow, deep, arch, dtype, config.teacher_top_k, to_student),
                                windows.train + windows.heldout, "kangaroo: running the target once per window")
        report = distill(_student(adapter, arch, dtype), teacher,
                         list(parameters.values()), windows.train, windows.heldout,
                         DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                       warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                                       grad_clip=config.grad_clip, eval_every=config.eval_every,
                                       seed=config.seed),
                         description="kangaroo: training adapter", heldout_scored=windows.heldout_scored)
        tqdm.write(f"kangaroo: adapter trained on {windows.source}: {report.summary()}")
        state.update(calibration=windows.source, training=report.to_json())
    return TrainResult({**_trained(adapter), **extra}, state)


def _trained(adapter) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in adapter_parameters(adapter).items()}


def adapter_parameters(adapter: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in adapter.named_parameters() if name.startswith(ADAPTER_MODULE + ".")}


def window_teacher(shallow, deep, arch, dtype, top_k: int, to_student) -> PackedTeacher:
    """windows → per window (the target's top-k next-token probabilities in the draft head's
    index space, (tokens, the exit states [1, T, H])), several windows a call."""
    device = next(shallow.parameters()).device

    def teach(windows: list[torch.Tensor]):
        windows = [w.to(device) for w in windows]
        inputs = packed_decoding_inputs(windows, arch.sliding_window)
        caches = empty_caches(arch, arch.num_layers, inputs[0].numel(), dtype, device)
        (exits,) = shallow(*inputs, *caches)
        (logits,) = deep(*inputs, *caches, exits)
        targets = sparse_target(torch.softmax(logits[0].float(), dim=-1), top_k, to_student).split(
            [w.numel() for w in windows])
        return [(target, (tokens, window_exits[None]))
                for target, tokens, window_exits in zip(targets, windows, unpack(exits[0], windows))]
    return PackedTeacher(teach, tokens_per_call(device))


def _student(adapter, arch, dtype):
    """(tokens, exit states) → the adapter's logits [T, V], its cache starting empty."""
    def predict(lesson) -> torch.Tensor:
        tokens, exits = lesson
        caches = empty_caches(arch, 1, tokens.numel(), dtype, tokens.device)
        (logits,) = adapter(*decoding_inputs(tokens, arch.sliding_window), *caches, exits)
        return logits[0]
    return predict
