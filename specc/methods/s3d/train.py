"""Train S3D's draft-only parameters at compile time: the mask embedding and the LoRA adapters.

Teacher: the frozen `target` graph on a window of T tokens, giving the full
model's next-token distribution at every position (kept as its top-k) and
its K/V of every layer the draft keeps. It runs once per distinct window.

Student: the `draft` graph exactly as it drafts, on one window at a time.
The window is cut into blocks of γ positions starting at a phase o (the
masks' placement); in each block the first position is the real token (the
root) and the others are mask tokens. Each row attends to the teacher's
K/V of the positions before its block, as a draft attends to the committed
prefix, and to its own block's draft rows up to itself; the draft rows
write their K/V after the window (slots T..2T-1), never over the teacher's.
Row s is trained towards the teacher's distribution after x_0..x_s, which
is what verification compares it with when the tokens before it were
accepted. A training example is a (window, phase) pair and the example
order covers every phase of every window, so all γ positions are trained.

Only the mask embedding and the adapters move (`distill`); the report
carries the held-out top-1 agreement at each draft position before and
after training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from specc.contract.descriptor import COMPILE_TIME_PREDICTION, TrainingContext, TrainResult
from specc.graph.nodes import placeholder
from specc.graph.signature import CACHE_ROLE, read_signature
from specc.methods.s3d.attach_draft_lora import DraftLoraConfig
from specc.methods.s3d.insert_mask_tokens import MaskTokensConfig
from specc.methods.s3d.skip_middle_layers import decoder_layers
from specc.methods.s3d.select import select_by_eq12
from specc.train.corpus import token_windows
from specc.train.distill import DistillConfig, PackedTeacher, SparseTarget, cache_teacher, distill, sparse_target
from specc.train.inputs import empty_caches
from specc.train.packing import packed_decoding_inputs, tokens_per_call, unpack

DRAFT_PREFIXES = (DraftLoraConfig().module_name + ".", MaskTokensConfig().parameter_name)


@dataclass(frozen=True)
class Lesson:
    """One training example: a window, and where its mask blocks start."""

    window: torch.Tensor
    phase: int


@dataclass(frozen=True)
class StudentInput:
    window: torch.Tensor
    kv: list[torch.Tensor]     # the teacher's K/V [1, kv_heads, T, head_dim] of every cache, in input order
    phase: int


def train_draft(context: TrainingContext, config, tokenizer) -> TrainResult:
    """The draft-only parameters by name, and the training report as state; with
    `select`, first the block and γ eq. 12 picks (training goes on in the chosen
    candidate's draft graph, and the returned config carries the choice)."""
    start = time.perf_counter()
    program = context.program
    target = program.graphs["target"].module
    arch = program.graphs["target"].architecture
    if config.train_steps == 0:
        draft = program.graphs["draft"].module
        return TrainResult(_copies(draft_parameters(draft)), _layout_state(draft, arch, config))
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, config.train_windows,
                            config.eval_sequences, config.seed)
    dtype = next(target.parameters()).dtype
    cached = cache_teacher(window_teacher(target, arch, dtype, config.teacher_top_k),
                           windows.train + windows.heldout, "s3d: running the target once per window")

    def teacher(lesson: Lesson) -> tuple[SparseTarget, StudentInput]:
        target_probs, (window, kv) = cached(lesson.window)
        return target_probs, StudentInput(window, kv, lesson.phase)

    def lessons(gamma: int) -> tuple[list[Lesson], list[Lesson]]:
        return ([Lesson(w, phase) for w in windows.train for phase in range(gamma)],
                [Lesson(w, phase) for w in windows.heldout for phase in range(gamma)])

    def trainer(draft, gamma: int):
        parameters = draft_parameters(draft)
        for name, p in draft.named_parameters():
            if name not in parameters:
                p.requires_grad_(False)   # every target weight is frozen; the target graph shares them
        student = draft_student(draft, arch, dtype, gamma)
        train, heldout = lessons(gamma)

        def run(steps: int, warmup: int, description: str):
            return distill(student, teacher, list(parameters.values()), train, heldout,
                           _distill_config(config, steps, warmup), description=description)
        return parameters, student, heldout, run

    selection = None
    if config.select:
        def pilot(draft, gamma: int) -> tuple[list[float], list[float]]:
            _, student, heldout, run = trainer(draft, gamma)
            untrained = agreement_by_position(student, teacher, heldout, gamma)
            run(config.select_steps, min(config.warmup_steps, config.select_steps // 2), "s3d: pilot")
            return untrained, agreement_by_position(student, teacher, heldout, gamma)
        selection = select_by_eq12(context, config, pilot)
        config = selection.config
    draft = program.graphs["draft"].module if selection is None else selection.chosen.module
    gamma = config.draft_tokens
    parameters, student, heldout, run = trainer(draft, gamma)
    before = (selection.chosen.untrained[:gamma] if selection is not None
              else agreement_by_position(student, teacher, heldout, gamma))
    report = run(config.train_steps, config.warmup_steps, "s3d: training mask embedding and LoRA")
    after = agreement_by_position(student, teacher, heldout, gamma)
    tqdm.write(f"s3d: trained on {windows.source}: {report.summary()}; held-out agreement by draft position "
               f"{_percent(before)} → {_percent(after)}")
    state = _layout_state(draft, arch, config)
    if selection is not None:
        state["selection"] = selection.report
        state[COMPILE_TIME_PREDICTION] = {
            "speedup": round(selection.predicted_speedup(after), 3),
            "by": "S3D eq. 12 over none from the held-out agreement after training and costs timed in eager "
                  f"on {selection.report['costs_timed_with']['device']} at compile (the engine runs "
                  f"{context.engine_backend} on {context.engine_device}), without loop overhead"}
    state.update(calibration=windows.source, training=report.to_json(),
                 heldout_agreement_by_position={"before": before, "after": after},
                 train_seconds=round(time.perf_counter() - start, 3))
    return TrainResult(_copies(parameters), state, config if selection is not None else None)


def _layout_state(draft, arch, config) -> dict:
    return {**draft_layout(draft, arch.num_layers), "draft_tokens": config.draft_tokens, "training": None}


def _distill_config(config, steps: int, warmup: int) -> DistillConfig:
    return DistillConfig(steps=steps, learning_rate=config.learning_rate, warmup_steps=warmup,
                         weight_decay=config.weight_decay, grad_clip=config.grad_clip, eval_every=config.eval_every,
                         seed=config.seed)


def draft_parameters(draft: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in draft.named_parameters() if name.startswith(DRAFT_PREFIXES)}


def draft_layout(draft, num_layers: int) -> dict:
    """Which layers the draft keeps and which block it skips (for the manifest)."""
    kept = decoder_layers(draft.graph)
    skipped = sorted(set(range(num_layers)) - set(kept))
    return {"num_layers": num_layers, "kept_layers": kept,
            "skipped_layers": [skipped[0], skipped[-1]] if skipped else []}


def read_caches(draft) -> list[int]:
    """Indices, in cache-input order, of the caches the draft graph reads (its kept layers')."""
    names = [spec.name for spec in read_signature(draft).inputs_with_role(CACHE_ROLE)]
    return [i for i, name in enumerate(names) if placeholder(draft.graph, name).users]


def _copies(parameters: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in parameters.items()}


def window_teacher(target, arch, dtype, top_k: int) -> PackedTeacher:
    """windows → per window (the target's top-k next-token probabilities, (window, K/V of
    every layer)), several windows a call. Every layer's K/V is kept so that any candidate
    block's draft can read its kept ones."""
    device = next(target.parameters()).device

    def teach(windows: list[torch.Tensor]):
        inputs = packed_decoding_inputs(windows, arch.sliding_window)
        caches = empty_caches(arch, arch.num_layers, inputs[0].numel(), dtype, device)
        (logits,) = target(*inputs, *caches)
        targets = sparse_target(torch.softmax(logits[0].float(), dim=-1), top_k).split([w.numel() for w in windows])
        kv = zip(*(unpack(cache[:, :, :-1], windows, dim=2) for cache in caches))
        return [(probs, (window, list(window_kv))) for probs, window, window_kv in zip(targets, windows, kv)]
    return PackedTeacher(teach, tokens_per_call(device))


def mask_positions(length: int, phase: int, gamma: int) -> torch.Tensor:
    """[length]: each position's place in its block (0: the real root token, d > 0: the
    d-th mask). Blocks of `gamma` start at `phase`; the positions before it form a
    shorter first block rooted at 0."""
    positions = torch.arange(length)
    return torch.minimum((positions - phase) % gamma, positions)


def draft_attention(depths: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, 2T]: row s sees the teacher's K/V (slots 0..T-1) before its block's root
    and its block's draft rows (slots T + root .. T + s)."""
    length = depths.numel()
    rows = torch.arange(length)[:, None]
    roots = rows - depths[:, None]
    columns = torch.arange(length)[None, :]
    prefix = columns < roots
    block = (columns >= roots) & (columns <= rows)
    return torch.cat([prefix, block], dim=1)[None, None]


def draft_student(draft, arch, dtype, gamma: int):
    """StudentInput → the draft graph's logits [T, V] with the masks of the input's phase."""
    num_caches = len(read_signature(draft).inputs_with_role(CACHE_ROLE))
    kept = read_caches(draft)

    def predict(lesson: StudentInput) -> torch.Tensor:
        window, length = lesson.window, lesson.window.numel()
        depths = mask_positions(length, lesson.phase, gamma)
        is_mask = depths > 0
        tokens = torch.where(is_mask, 0, window)
        positions = torch.arange(length)
        shape = (1, arch.num_key_value_heads, 2 * length + 1, arch.head_dim)
        unused = torch.zeros(shape, dtype=dtype)   # the skipped layers' caches: inputs, never read
        caches = [unused] * num_caches
        for index in kept:
            caches[index] = torch.zeros(shape, dtype=dtype)
            caches[index][:, :, :length] = lesson.kv[index]
        (logits,) = draft(tokens[None], positions[None], draft_attention(depths), positions + length, *caches,
                          is_mask[None])
        return logits[0]

    return predict


def agreement_by_position(student, teacher, lessons: list[Lesson], gamma: int) -> list[float]:
    """Held-out top-1 agreement of the draft with the target at each of the γ draft positions."""
    agree = torch.zeros(gamma)
    count = torch.zeros(gamma)
    with torch.no_grad():
        for lesson in lessons:
            target, student_input = teacher(lesson)
            hits = (student(student_input).argmax(dim=-1) == target.top1).float()
            depths = mask_positions(lesson.window.numel(), lesson.phase, gamma)
            agree.index_add_(0, depths, hits)
            count.index_add_(0, depths, torch.ones_like(hits))
    return [round(float(a / c), 4) if c else None for a, c in zip(agree, count)]


def _percent(values: list[float]) -> str:
    return "/".join(f"{100 * v:.0f}%" for v in values if v is not None)
