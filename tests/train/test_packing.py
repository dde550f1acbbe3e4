"""Teacher passes over several windows in one call (`specc.train.packing`): each window's
outputs are the ones it gets alone, on every family's quirks (sliding windows included)."""

from __future__ import annotations

import pytest
import torch

from specc.compiler import training_context
from specc.contract.descriptor import get_method
from specc.testing.checkpoints import FAMILIES, quirky_config
from specc.train.distill import PackedTeacher, cache_teacher
from specc.train.packing import packed_decoding_inputs, tokens_per_call, unpack, window_groups

MAX_SEQ_LEN = 96
LENGTHS = (16, 9, 16, 5, 16)   # several windows longer than the quirky sliding window (6)


def windows(lengths=LENGTHS, vocab: int = 96) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=generator) for n in lengths]


def test_packed_inputs_restart_positions_and_keep_each_window_to_itself():
    tokens, positions, mask, slots = packed_decoding_inputs([torch.tensor([5, 6, 7]), torch.tensor([8, 9])], None)
    assert tokens.tolist() == [[5, 6, 7, 8, 9]]
    assert positions.tolist() == [[0, 1, 2, 0, 1]]
    assert slots.tolist() == [0, 1, 2, 3, 4]
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0],
                                         [1, 1, 1, 0, 0],
                                         [0, 0, 0, 1, 0],
                                         [0, 0, 0, 1, 1]]


def test_a_sliding_window_counts_positions_within_each_window():
    _, _, mask, _ = packed_decoding_inputs([torch.arange(3), torch.arange(4)], sliding_window=2)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0, 0, 0],
                                         [0, 1, 1, 0, 0, 0, 0],
                                         [0, 0, 0, 1, 0, 0, 0],
                                         [0, 0, 0, 1, 1, 0, 0],
                                         [0, 0, 0, 0, 1, 1, 0],
                                         [0, 0, 0, 0, 0, 1, 1]]


def test_groups_fill_the_token_budget_in_order_and_a_long_window_goes_alone():
    parts = windows((4, 4, 3, 9, 2, 2))
    sizes = [[w.numel() for w in group] for group in window_groups(parts, 8)]
    assert sizes == [[4, 4], [3], [9], [2, 2]]
    assert [len(group) for group in window_groups(parts, 0)] == [1] * 6, "no budget: one window a call"
    assert [w for group in window_groups(parts, 8) for w in group] == parts


def test_unpacked_rows_are_tensors_of_their_own():
    rows = torch.arange(10.0)[:, None]
    parts = unpack(rows, [torch.zeros(4), torch.zeros(6)])
    assert [p.shape[0] for p in parts] == [4, 6]
    assert parts[1].untyped_storage().nbytes() == 6 * 4, "a view would keep the whole call alive"


def test_a_gpu_packs_more_tokens_a_call_than_a_cpu():
    assert tokens_per_call("cuda:0") > tokens_per_call("cpu") >= 128


def test_cache_teacher_runs_packed_calls_and_serves_each_window():
    calls = []

    def teach(group):
        calls.append([w.numel() for w in group])
        return [(w.sum(), w) for w in group]

    parts = windows((4, 4, 3))
    cached = cache_teacher(PackedTeacher(teach, 8), parts + parts[:1], "test")
    assert calls == [[4, 4], [3]], "each distinct window once, packed"
    assert all(torch.equal(cached(w)[1], w) for w in parts)


def program_context(method: str, family: str, config=None):
    from transformers import AutoModelForCausalLM

    descriptor = get_method(method)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(quirky_config(family)).eval()
    return training_context({"target": model}, descriptor, config or descriptor.config_class(), MAX_SEQ_LEN)


def assert_same_per_window(teacher: PackedTeacher, parts: list[torch.Tensor]):
    alone = [teacher.teach([w])[0] for w in parts]
    together = teacher.teach(parts)
    assert len(together) == len(parts)
    for (target, lesson), (packed_target, packed_lesson) in zip(alone, together):
        torch.testing.assert_close(packed_target.probs, target.probs, atol=1e-5, rtol=1e-4)
        assert torch.equal(packed_target.top1, target.top1)
        for value, packed in zip(_tensors(lesson), _tensors(packed_lesson)):
            assert packed.shape == value.shape
            torch.testing.assert_close(packed, value, atol=1e-5, rtol=1e-4)


def _tensors(lesson) -> list[torch.Tensor]:
    if isinstance(lesson, torch.Tensor):
        return [lesson]
    return [t for item in lesson for t in _tensors(item)]


@pytest.mark.parametrize("family", FAMILIES)
def test_kangaroo_teacher_packed_matches_each_window_alone(family, one_thread):
    from specc.methods.kangaroo.train import window_teacher

    context = program_context("kangaroo", family)
    graphs = context.program.graphs
    teacher = window_teacher(graphs["shallow"].module, graphs["deep"].module, graphs["shallow"].architecture,
                             torch.float32, 8, None)
    assert_same_per_window(teacher, windows())


def test_eagle_teacher_packed_matches_each_window_alone(one_thread):
    from specc.methods.eagle.config import parse_layers
    from specc.methods.eagle.expose_fused_features import FusedFeaturesConfig
    from specc.methods.eagle.train import teacher_graph, window_teacher

    config = get_method("eagle").config_class()
    context = program_context("eagle", "mistral", config)
    arch = context.program.graphs["target"].architecture
    layers = FusedFeaturesConfig(parse_layers(config.fused_layers)).resolve(arch.num_layers)
    teacher = window_teacher(teacher_graph(context, config, layers), arch, torch.float32, 8, None, steps=3)
    assert_same_per_window(teacher, windows())


def test_specee_teacher_packed_matches_each_window_alone(one_thread):
    from specc.methods.specee.train import window_teacher

    context = program_context("specee", "qwen2")
    verify = context.program.graphs["verify"]
    assert_same_per_window(window_teacher(verify.module, verify.architecture, torch.float32, 8, None), windows())


def test_s3d_teacher_packed_matches_each_window_alone(one_thread):
    from specc.methods.s3d.train import window_teacher

    context = program_context("s3d", "phi3")
    target = context.program.graphs["target"]
    assert_same_per_window(window_teacher(target.module, target.architecture, torch.float32, 8), windows())
