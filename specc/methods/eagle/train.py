"""Train eagle's draft head at compile time: self-distillation with training-time test.

Teacher: the frozen target, run once per training window (several windows a call,
`specc.train.packing`) through a training-only graph that also returns the states
entering the three fused layers (`expose_layer_inputs`); it keeps those states and
the target's top-k next-token probabilities (in the draft head's index space).

Student: the fusion `W_fc` (the target graph's `eagle.fc.weight`) and the `head`
graph, unrolled `ttt_steps` deep on its own outputs, as EAGLE-3 trains it:
- step 1 reads, at every position p, the token at p and the fused feature of p - 1
  (teacher-forced, as the head sees committed positions while drafting), and
  predicts the target's distribution at p;
- step k reads the token at p + k - 1 and the head's own step k - 1 hidden state at
  p + k - 2 (as it drafts ahead), attending to step 1's keys up to p and to its own
  chain's keys of steps 2..k, and predicts the target's distribution at p + k - 1.
All steps' positions are one soft cross-entropy. Each step writes its keys into its
own block of cache slots; the cache is cloned between steps so the autograd graph
of the earlier step keeps the keys it read.

Only `eagle.*` parameters and `W_fc` move; the embedding, the shared LM head and the
draft head's rows stay frozen. The held-out top-1 agreement per draft depth (the
share of step-k predictions that match the target's argmax) goes to the manifest
state before and after training.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from specc.contract.descriptor import TARGET, GraphRecipe, TrainingContext, TrainResult
from specc.contract.infrastructure import infrastructure_passes
from specc.methods.eagle.attach_eagle_head import MODULE
from specc.methods.eagle.expose_fused_features import FC_WEIGHT, FusedFeaturesConfig
from specc.methods.eagle.config import parse_layers
from specc.passes.expose_layer_inputs import ExposeLayerInputs, LayerInputsConfig
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.runtime.masks import apply_sliding_window
from specc.train.corpus import token_windows
from specc.train.distill import DistillConfig, PackedTeacher, SparseTarget, cache_teacher, distill, sparse_target
from specc.train.inputs import empty_caches
from specc.train.packing import packed_decoding_inputs, tokens_per_call, unpack
from specc.train.vocabulary import frequent_tokens, student_index

HEAD_WEIGHT = f"{DraftVocabularyConfig.module_name}.weight"


def train_head(context: TrainingContext, config, tokenizer) -> TrainResult:
    """The head's weights, W_fc (and the reduced draft head) by name; the fused layers, the
    trained parameter count, the training report and the draft vocabulary as state."""
    program = context.program
    arch = program.graphs["target"].architecture
    layers = FusedFeaturesConfig(parse_layers(config.fused_layers)).resolve(arch.num_layers)
    state = {"fused_layers": list(layers), "training": None}
    reduce = 0 < config.draft_vocab_size < arch.vocab_size
    fc = program.graphs["target"].module.get_parameter(FC_WEIGHT)
    state["head_parameters"] = fc.numel() + sum(p.numel() for p in head_parameters(program.graphs["head"].module)
                                                .values())
    if not reduce and config.train_steps == 0:
        return TrainResult(_trained(program.graphs["head"].module, fc), state)
    used = min(config.train_windows, max(config.train_steps, 1))
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, used, config.eval_sequences,
                            config.seed)
    to_student, extra = None, {}
    if reduce:
        ids = frequent_tokens(windows.train, arch, config.draft_vocab_size)
        program = context.build(config, {DRAFT_VOCABULARY_KEY: ids}, names=("head",))
        to_student = student_index(ids, arch.vocab_size)
        extra = {HEAD_WEIGHT: program.graphs["head"].module.get_parameter(HEAD_WEIGHT).detach().clone()}
        state[DRAFT_VOCABULARY_KEY] = ids
    head = program.graphs["head"].module
    parameters = [fc, *head_parameters(head).values()]
    device, dtype = fc.device, fc.dtype
    for name, p in head.named_parameters():
        p.requires_grad_(name.startswith(MODULE + "."))
    if config.train_steps > 0:
        graph = teacher_graph(context, config, layers)
        to_student = None if to_student is None else to_student.to(device)
        steps = config.ttt_steps
        teacher = cache_teacher(window_teacher(graph, arch, dtype, config.teacher_top_k, to_student, steps),
                                windows.train + windows.heldout, "eagle: running the target once per window")
        student = _student(head, fc, arch, dtype, steps)
        scored = None if windows.heldout_scored is None else [_unrolled_mask(m, steps) for m in windows.heldout_scored]
        before = depth_agreement(student, teacher, windows.heldout, steps)
        report = distill(student, teacher, parameters, windows.train, windows.heldout,
                         DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                       warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                                       grad_clip=config.grad_clip, eval_every=config.eval_every, seed=config.seed),
                         description="eagle: training draft head", heldout_scored=scored)
        after = depth_agreement(student, teacher, windows.heldout, steps)
        tqdm.write(f"eagle: draft head trained on {windows.source}: {report.summary()}; held-out top-1 agreement "
                   f"per depth {_percentages(before)} → {_percentages(after)}")
        state.update(calibration=windows.source, training={**report.to_json(), "heldout_by_depth_initial": before,
                                                           "heldout_by_depth": after})
    return TrainResult({**_trained(head, fc), **extra}, state)


def head_parameters(head: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in head.named_parameters() if name.startswith(MODULE + ".")}


def _trained(head, fc) -> dict[str, torch.Tensor]:
    return {FC_WEIGHT: fc.detach().clone(), **{name: p.detach().clone() for name, p in head_parameters(head).items()}}


def teacher_graph(context: TrainingContext, config, layers):
    recipe = GraphRecipe(TARGET, lambda c: infrastructure_passes() + [ExposeLayerInputs(LayerInputsConfig(layers))])
    return context.build_graphs({"teacher": recipe}, config).graphs["teacher"].module


def window_teacher(graph, arch, dtype, top_k: int, to_student, steps: int) -> PackedTeacher:
    """windows → per window (the target's top-k next-token probabilities, unrolled for
    `steps` steps, (tokens, the three states concatenated [T, 3H])), several windows a call."""
    device = next(graph.parameters()).device

    def teach(windows: list[torch.Tensor]):
        windows = [w.to(device) for w in windows]
        inputs = packed_decoding_inputs(windows, arch.sliding_window)
        caches = empty_caches(arch, arch.num_layers, inputs[0].numel(), dtype, device)
        logits, *states = graph(*inputs, *caches)
        targets = sparse_target(torch.softmax(logits[0].float(), dim=-1), top_k, to_student).split(
            [w.numel() for w in windows])
        return [(_unrolled_target(target, steps), (tokens, window_states))
                for target, tokens, window_states in zip(targets, windows,
                                                         unpack(torch.cat(states, dim=-1)[0], windows))]
    return PackedTeacher(teach, tokens_per_call(device))


def _unrolled_target(target: SparseTarget, steps: int) -> SparseTarget:
    """Step k's rows predict positions k - 1 .. T - 1: the targets of every step, concatenated."""
    return SparseTarget(torch.cat([target.indices[k:] for k in range(steps)]),
                        torch.cat([target.probs[k:] for k in range(steps)]),
                        torch.cat([target.top1[k:] for k in range(steps)]))


def _unrolled_mask(mask: torch.Tensor, steps: int) -> torch.Tensor:
    return torch.cat([mask[k:] for k in range(steps)])


def _student(head, fc, arch, dtype, steps: int):
    """(tokens, fused-layer states) → the head's logits for every unrolled step, concatenated."""
    def predict(lesson) -> torch.Tensor:
        tokens, states = lesson
        count = tokens.numel()
        features = torch.nn.functional.linear(states, fc)
        feature = torch.cat([features.new_zeros(1, features.shape[-1]), features[:-1]])
        caches = empty_caches(arch, 1, steps * count, dtype, tokens.device)
        outputs = []
        for step in range(steps):
            rows = count - step
            positions = torch.arange(step, count, device=tokens.device)
            slots = torch.arange(rows, device=tokens.device) + step * count
            mask = apply_sliding_window(unrolled_attention(count, step, tokens.device), positions,
                                        arch.sliding_window)
            logits, hidden = head(tokens[step:][None], positions[None], mask, slots, *caches, feature[None])
            outputs.append(logits[0])
            feature = hidden[0, :-1] if step + 1 < steps else None
            caches = [c.clone() for c in caches]
        return torch.cat(outputs)
    return predict


def unrolled_attention(count: int, step: int, device) -> torch.Tensor:
    """[1, 1, rows, (step + 1) · count]: the row of chain p (position p + step) sees step 1's
    keys at slots 0..p and its own chain's keys of the later steps (slot s · count + p)."""
    rows = count - step
    chain = torch.arange(rows, device=device)
    mask = torch.zeros(rows, (step + 1) * count, dtype=torch.bool, device=device)
    mask[:, :count] = torch.arange(count, device=device)[None, :] <= chain[:, None]
    for earlier in range(1, step + 1):
        mask[chain, earlier * count + chain] = True
    return mask[None, None]


def depth_agreement(student, teacher, examples: list[torch.Tensor], steps: int) -> list[float]:
    """Held-out top-1 agreement with the target at each unrolled step (draft depth)."""
    agree, total = [0] * steps, [0] * steps
    with torch.no_grad():
        for example in examples:
            target, lesson = teacher(example)
            predicted = student(lesson).argmax(dim=-1)
            count, start = lesson[0].numel(), 0
            for step in range(steps):
                rows = count - step
                agree[step] += int((predicted[start:start + rows] == target.top1[start:start + rows]).sum())
                total[step] += rows
                start += rows
    return [round(a / t, 4) if t else 0.0 for a, t in zip(agree, total)]


def _percentages(values: list[float]) -> str:
    return "/".join(f"{v:.3f}" for v in values)
