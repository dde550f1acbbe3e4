"""Self-distillation of added parameters from a frozen teacher: soft-label cross-entropy.

The loss at each position is −Σ_v p_teacher(v) · log p_student(v), the
paper's objective (Kangaroo eq. 3); its floor is the teacher's entropy, not
zero. AdamW with linear warm-up then cosine decay, gradient-norm clipping,
one example per step. Parameters that are not float32 are trained through
float32 master copies. Deterministic for a fixed seed: the example order is
drawn from it and nothing else is random.

Progress is a tqdm bar with the running loss and the held-out top-1
agreement between student and teacher, which is the share of draft tokens
greedy verification would accept one step ahead.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from specc.console.progress import in_terminal, progress_bar

from specc.host.threads import LoadFollower
from specc.train.heap import releasing
from specc.train.packing import window_groups


LOSSES_READ_EVERY = 20   # training steps between reads of their losses (and progress bar updates)


@dataclass(frozen=True)
class DistillConfig:
    steps: int
    learning_rate: float
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eval_every: int = 50
    seed: int = 0


@dataclass
class Evaluation:
    step: int
    loss: float          # held-out soft cross-entropy
    acceptance: float    # held-out top-1 agreement with the teacher


@dataclass
class DistillReport:
    steps: int
    seconds: float
    evaluations: list[Evaluation] = field(default_factory=list)
    train_loss_first: float | None = None    # mean over the first tenth of the steps
    train_loss_last: float | None = None     # mean over the last tenth

    @property
    def initial(self) -> Evaluation:
        return self.evaluations[0]

    @property
    def final(self) -> Evaluation:
        return self.evaluations[-1]

    def to_json(self) -> dict:
        return {
            "steps": self.steps, "seconds": round(self.seconds, 3),
            "train_loss_first": _round(self.train_loss_first), "train_loss_last": _round(self.train_loss_last),
            "heldout": [{k: _round(v) for k, v in asdict(e).items()} for e in self.evaluations],
        }

    def summary(self) -> str:
        return (f"{self.steps} steps in {self.seconds:.1f}s; held-out loss {self.initial.loss:.3f} → "
                f"{self.final.loss:.3f}, top-1 acceptance {self.initial.acceptance:.3f} → "
                f"{self.final.acceptance:.3f}")


@dataclass
class SparseTarget:
    """The teacher's top-k next-token probabilities per position, in the
    student's index space: small enough to precompute for a whole training
    set. Entries outside the student's vocabulary have index -1."""

    indices: torch.Tensor   # [N, k] long
    probs: torch.Tensor     # [N, k] float32, renormalised over the kept entries
    top1: torch.Tensor      # [N] the teacher's argmax in the student's index space (-1: outside it)

    @property
    def positions(self) -> int:
        return self.indices.shape[0]

    def split(self, lengths: list[int]) -> list[SparseTarget]:
        """Consecutive runs of `lengths` positions, each with tensors of its own."""
        parts = [t.split(lengths) for t in (self.indices, self.probs, self.top1)]
        return [SparseTarget(*(part.clone() for part in run)) for run in zip(*parts)]


Target = torch.Tensor | SparseTarget   # dense probs [N, V], or sparse top-k
Teacher = Callable[[torch.Tensor], tuple[Target, object]]   # example → (target, student input)
Student = Callable[[object], torch.Tensor]                  # student input → logits [N, V]


@dataclass(frozen=True)
class PackedTeacher:
    """A teacher that takes several windows in one call (`specc.train.packing`): `teach`
    maps a list of windows, `tokens_per_call` tokens at most unless one window is longer,
    to each window's (target, student input)."""

    teach: Callable[[list[torch.Tensor]], list[tuple[Target, object]]]
    tokens_per_call: int


def soft_cross_entropy(student_logits: torch.Tensor, target: Target) -> torch.Tensor:
    """Mean over positions of −Σ p_teacher log softmax(student), in float32."""
    return _position_losses(student_logits, target).mean()


def _position_losses(student_logits: torch.Tensor, target: Target) -> torch.Tensor:
    """−Σ p_teacher log softmax(student) per position [N], in float32."""
    log_q = torch.log_softmax(student_logits.float(), dim=-1)
    if isinstance(target, SparseTarget):
        kept = target.indices >= 0
        picked = log_q.gather(-1, target.indices.clamp(min=0))
        return -(target.probs * picked * kept).sum(dim=-1)
    return -(target * log_q).sum(dim=-1)


def sparse_target(probs: torch.Tensor, k: int, to_student: torch.Tensor | None = None) -> SparseTarget:
    """Top-k of dense teacher probabilities [N, V]; `to_student` maps a vocabulary
    id to the student's index (-1 where the student cannot emit it)."""
    values, indices = probs.float().topk(min(k, probs.shape[-1]), dim=-1)
    if to_student is not None:
        indices = to_student[indices]
    kept = (indices >= 0).float()
    values = values * kept
    values = values / values.sum(-1, keepdim=True).clamp(min=1e-9)
    return SparseTarget(indices, values, indices[:, 0].clone())


def cache_teacher(teacher: Teacher | PackedTeacher, examples: list[torch.Tensor], description: str) -> Teacher:
    """Run the frozen teacher once per distinct example and serve its outputs
    from memory afterwards (the teacher is most of the cost of a step)."""
    packed = teacher if isinstance(teacher, PackedTeacher) else PackedTeacher(lambda group: [teacher(group[0])], 0)
    distinct = list({id(example): example for example in examples}.values())
    cached = {}
    follow_load = LoadFollower()
    with progress_bar(total=len(distinct), desc=description, unit="window") as bar:
        for group in releasing(window_groups(distinct, packed.tokens_per_call)):
            follow_load()
            with torch.no_grad():
                cached.update(zip(map(id, group), packed.teach(group)))
            bar.update(len(group))
    return lambda example: cached[id(example)] if id(example) in cached else packed.teach([example])[0]


def _top1(target: Target) -> torch.Tensor:
    return target.top1 if isinstance(target, SparseTarget) else target.argmax(dim=-1)


def _positions(target: Target) -> int:
    return target.positions if isinstance(target, SparseTarget) else target.shape[0]


def distill(student: Student, teacher: Teacher, parameters: list[torch.nn.Parameter],
            train_examples: list[torch.Tensor], heldout_examples: list[torch.Tensor], config: DistillConfig,
            description: str = "distilling", heldout_scored: list[torch.Tensor] | None = None) -> DistillReport:
    """`heldout_scored`: per held-out example, the positions the held-out figures count
    (`TokenWindows.heldout_scored`); None counts every position."""
    start = time.perf_counter()
    for p in parameters:
        p.requires_grad_(True)
    masters = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_(True) for p in parameters]
    optimizer = torch.optim.AdamW(masters, lr=config.learning_rate, betas=config.betas,
                                  weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(config.warmup_steps, config.steps))
    order = _example_order(len(train_examples), config.steps, config.seed)
    report = DistillReport(steps=config.steps, seconds=0.0)
    report.evaluations.append(evaluate(student, teacher, heldout_examples, 0, heldout_scored))
    losses: list[float] = []
    pending: list[torch.Tensor] = []   # read back a few steps at a time: each read waits for a GPU
    bar = progress_bar(order, desc=description, unit="step")
    follow_load = LoadFollower()
    for step, index in enumerate(bar, start=1):
        follow_load()
        with torch.no_grad():
            target, student_input = teacher(train_examples[index])
        loss = soft_cross_entropy(student(student_input), target)
        loss.backward()
        distill_step(parameters, masters, optimizer, config.grad_clip)
        schedule.step()
        pending.append(loss.detach())
        evaluating = step % config.eval_every == 0 or step == config.steps
        if evaluating:
            report.evaluations.append(evaluate(student, teacher, heldout_examples, step, heldout_scored))
        if evaluating or len(pending) == LOSSES_READ_EVERY:
            losses += torch.stack(pending).tolist()
            pending.clear()
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}",
                            accept=f"{report.final.acceptance:.3f}", refresh=in_terminal(bar))
    bar.close()
    for p in parameters:
        p.requires_grad_(False)
    tenth = max(1, len(losses) // 10)
    if losses:
        report.train_loss_first = sum(losses[:tenth]) / tenth
        report.train_loss_last = sum(losses[-tenth:]) / tenth
    report.seconds = time.perf_counter() - start
    return report


def evaluate(student: Student, teacher: Teacher, examples: list[torch.Tensor], step: int,
             scored: list[torch.Tensor] | None = None) -> Evaluation:
    """Held-out loss and top-1 agreement over the positions `scored` marks (all when None,
    or when the marks leave none)."""
    total_loss, agree, positions = 0.0, 0, 0
    with torch.no_grad():
        for index, example in enumerate(examples):
            target, student_input = teacher(example)
            logits = student(student_input)
            keep = (torch.ones(_positions(target), dtype=torch.bool) if scored is None
                    else scored[index]).to(logits.device)
            total_loss += float((_position_losses(logits, target) * keep).sum())
            agree += int(((logits.argmax(dim=-1) == _top1(target)) & keep).sum())
            positions += int(keep.sum())
    if positions == 0:
        return evaluate(student, teacher, examples, step)
    return Evaluation(step, total_loss / positions, agree / positions)


def distill_step(parameters, masters, optimizer, grad_clip: float) -> None:
    for p, master in zip(parameters, masters):
        if master is not p:
            master.grad = p.grad.float()
            p.grad = None
    torch.nn.utils.clip_grad_norm_(masters, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p, master in zip(parameters, masters):
            if master is not p:
                p.copy_(master)


def _example_order(count: int, steps: int, seed: int) -> list[int]:
    """Each example once per epoch, epochs shuffled by `seed`."""
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < steps:
        order += torch.randperm(count, generator=generator).tolist()
    return order[:steps]


def warmup_cosine(warmup: int, steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def _round(value):
    return round(value, 4) if isinstance(value, float) else value
