"""distill: soft-label cross-entropy against a frozen teacher, AdamW, warm-up, clipping, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from specc.train.distill import DistillConfig, distill_step, warmup_cosine, distill, soft_cross_entropy

VOCAB, WIDTH = 12, 8


def toy_problem(seed: int = 0):
    """A fixed linear teacher; the student is a fresh linear map of the same inputs."""
    generator = torch.Generator().manual_seed(seed)
    teacher_weight = torch.randn(VOCAB, WIDTH, generator=generator) * 2
    examples = [torch.randn(16, WIDTH, generator=generator) for _ in range(24)]

    def teacher(x):
        return torch.softmax(x @ teacher_weight.T, dim=-1), x

    return teacher, examples[:20], examples[20:]


def student_of(weight: torch.nn.Parameter):
    return lambda x: x @ weight.T.to(x.dtype)


def test_soft_cross_entropy_is_cross_entropy_for_one_hot_teachers():
    logits = torch.randn(5, VOCAB)
    labels = torch.randint(0, VOCAB, (5,))
    one_hot = torch.nn.functional.one_hot(labels, VOCAB).float()
    torch.testing.assert_close(soft_cross_entropy(logits, one_hot), torch.nn.functional.cross_entropy(logits, labels))


def test_distilling_lowers_heldout_loss_and_raises_agreement():
    teacher, train, heldout = toy_problem()
    weight = torch.nn.Parameter(torch.zeros(VOCAB, WIDTH))
    report = distill(student_of(weight), teacher, [weight], train, heldout,
                     DistillConfig(steps=120, learning_rate=5e-2, warmup_steps=10, eval_every=40))
    assert [e.step for e in report.evaluations] == [0, 40, 80, 120]
    assert report.final.loss < report.initial.loss - 0.5
    assert report.final.acceptance > report.initial.acceptance + 0.3
    assert report.train_loss_last < report.train_loss_first
    assert not weight.requires_grad, "parameters are frozen again after training"


def test_same_seed_same_weights_other_seed_other_weights():
    def run(seed):
        teacher, train, heldout = toy_problem()
        weight = torch.nn.Parameter(torch.zeros(VOCAB, WIDTH))
        distill(student_of(weight), teacher, [weight], train, heldout,
                DistillConfig(steps=15, learning_rate=1e-2, seed=seed))
        return weight.detach().clone()

    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_low_precision_parameters_train_through_float32_masters():
    teacher, train, heldout = toy_problem()
    weight = torch.nn.Parameter(torch.zeros(VOCAB, WIDTH, dtype=torch.bfloat16))
    report = distill(student_of(weight), teacher, [weight], train, heldout,
                     DistillConfig(steps=60, learning_rate=5e-2, eval_every=60))
    assert weight.dtype == torch.bfloat16 and weight.grad is None
    assert report.final.loss < report.initial.loss


def test_gradients_are_clipped_before_the_step():
    weight = torch.nn.Parameter(torch.zeros(3))
    weight.grad = torch.full((3,), 100.0)
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(float(weight.grad.norm()))
            return super().step(closure)

    distill_step([weight], [weight], Recording([weight], lr=1.0), grad_clip=0.5)
    assert seen == pytest.approx([0.5])
    assert weight.grad is None


def test_warmup_then_cosine_schedule():
    factor = warmup_cosine(warmup=4, steps=12)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(factor(8), 0.5) and factor(12) == 0.0 and factor(40) == 0.0


def test_zero_steps_only_evaluates():
    teacher, train, heldout = toy_problem()
    weight = torch.nn.Parameter(torch.zeros(VOCAB, WIDTH))
    report = distill(student_of(weight), teacher, [weight], train, heldout, DistillConfig(steps=0, learning_rate=1.0))
    assert len(report.evaluations) == 1 and torch.equal(weight, torch.zeros(VOCAB, WIDTH))


def test_held_out_figures_count_only_the_scored_positions():
    from specc.train.distill import evaluate

    teacher_probs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    teacher = lambda example: (teacher_probs, None)   # noqa: E731
    student = lambda _: torch.tensor([[5.0, 0.0], [5.0, 0.0], [5.0, 0.0], [5.0, 0.0]])   # noqa: E731
    examples = [torch.zeros(4)]
    assert evaluate(student, teacher, examples, 0).acceptance == 0.5
    scored = evaluate(student, teacher, examples, 0, [torch.tensor([True, False, True, False])])
    assert scored.acceptance == 1.0 and scored.loss == pytest.approx(-math.log(torch.softmax(
        torch.tensor([5.0, 0.0]), 0)[0].item()), rel=1e-4)
    none_scored = evaluate(student, teacher, examples, 0, [torch.zeros(4, dtype=torch.bool)])
    assert none_scored.acceptance == 0.5   # marks that leave nothing fall back to every position
