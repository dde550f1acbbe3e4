"""Acceptance rules on hand-built trees, and the static tree tensors."""

from __future__ import annotations

import pytest
import torch

from specc.contract.tree import TreeSpec, tree_tensors
from specc.runtime.acceptance import accept_greedy, accept_sampled_tree
from specc.runtime.kv_cache import KVCache
from specc.runtime.masks import causal_chunk_mask, tree_mask
from specc.runtime.stats import GenerationStats

VOCAB = 10


def one_hot_logits(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), VOCAB)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_tree_tensors_describe_a_caterpillar():
    tree = tree_tensors(TreeSpec((2, 3)))
    # root 0; depth 1: nodes 1 (chain), 2; depth 2: nodes 3 (chain), 4, 5 under node 1
    assert tree.parent == (-1, 0, 0, 1, 1, 1)
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.children(0) == (1, 2) and tree.children(1) == (3, 4, 5) and tree.children(2) == ()
    assert tree.ancestor_mask[4].tolist() == [True, True, False, False, True, False]
    assert tree_tensors(TreeSpec((2, 3))) is tree, "tree tensors are built once per shape"


def test_tree_mask_lets_each_node_see_prefix_and_ancestors():
    tree = tree_tensors(TreeSpec((2,)))
    mask = tree_mask(4, tree)[0, 0]
    assert mask.shape == (3, 7)
    assert mask[:, :4].all()
    assert mask[2, 4:].tolist() == [True, False, True]
    assert causal_chunk_mask(2, 3)[0, 0].tolist() == [
        [True, True, True, False, False], [True, True, True, True, False], [True, True, True, True, True]]


def test_greedy_accepts_longest_matching_path_plus_bonus():
    tree = tree_tensors(TreeSpec((2, 2)))
    node_tokens = torch.tensor([9, 4, 5, 6, 7])     # root, d1: 4 (chain) / 5, d2: 6 (chain) / 7
    # target after root says 4 (chain), after node 1 says 7 (a sibling leaf), after node 4 says 3
    result = accept_greedy(node_tokens, one_hot_logits([4, 7, 0, 0, 3]), tree)
    assert result.path == [0, 1, 4] and result.next_token == 3


def test_greedy_rejects_everything_and_emits_the_target_token():
    tree = tree_tensors(TreeSpec.chain(3))
    result = accept_greedy(torch.tensor([9, 1, 2, 3]), one_hot_logits([8, 0, 0, 0]), tree)
    assert result.path == [0] and result.next_token == 8


def test_greedy_accepts_a_sibling_at_the_first_depth():
    tree = tree_tensors(TreeSpec((3, 1)))
    result = accept_greedy(torch.tensor([9, 1, 2, 3, 4]), one_hot_logits([3, 0, 0, 6, 0]), tree)
    assert result.path == [0, 3] and result.next_token == 6


def drafted_greedy_round(tree, generator: torch.Generator, agreement: float = 0.7):
    """Logits with ties (four distinct values) and node tokens that carry their parent's argmax
    with probability `agreement`, so paths of every length occur."""
    logits = torch.randint(0, 4, (tree.spec.num_nodes, VOCAB), generator=generator).float()
    best = logits.argmax(dim=-1)
    tokens = torch.randint(0, VOCAB, (tree.spec.num_nodes,), generator=generator)
    for node, parent in enumerate(tree.parent[1:], start=1):
        if float(torch.rand((), generator=generator)) < agreement:
            tokens[node] = best[parent]
    return tokens, logits


def test_greedy_on_the_device_path_accepts_what_the_host_walk_accepts():
    """The op path (`greedy_accept`; here the interpreted Triton kernel, or its reference without
    triton) against the host walk on random caterpillar trees and chains."""
    generator = torch.Generator().manual_seed(0)
    lengths = set()
    for round_ in range(80):
        depth = int(torch.randint(1, 6, (), generator=generator))
        widths = (1,) * depth if round_ % 4 == 0 else tuple(torch.randint(1, 4, (depth,), generator=generator).tolist())
        tree = tree_tensors(TreeSpec(widths))
        tokens, logits = drafted_greedy_round(tree, generator)
        host = accept_greedy(tokens, logits, tree, on_device=False)
        on_device = accept_greedy(tokens, logits, tree, on_device=True)
        assert (on_device.path, on_device.next_token) == (host.path, host.next_token)
        assert on_device.accepted_tokens == tokens[host.path[1:]].tolist() and host.accepted_tokens is None
        lengths.add(len(host.path))
    assert len(lengths) >= 4, f"random rounds should accept paths of many lengths, got {sorted(lengths)}"


def test_greedy_on_cpu_logits_walks_on_the_host(monkeypatch):
    import specc.runtime.acceptance as acceptance

    monkeypatch.setattr(acceptance, "_accept_greedy_on_device", lambda *args: pytest.fail("the op ran"))
    tree = tree_tensors(TreeSpec((2, 2)))
    result = accept_greedy(torch.tensor([9, 4, 5, 6, 7]), one_hot_logits([4, 7, 0, 0, 3]), tree)
    assert result.path == [0, 1, 4] and result.next_token == 3


def test_a_failing_op_falls_back_to_the_host_walk_for_good(monkeypatch, caplog):
    import specc.runtime.acceptance as acceptance

    def broken(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(acceptance, "_OP_FAILED", [])
    monkeypatch.setattr(acceptance, "_accept_greedy_on_device", broken)
    monkeypatch.setattr(acceptance, "_sample_on_device", broken)
    monkeypatch.setattr(acceptance, "_use_op", lambda on_device, scores: on_device is not False)   # as on CUDA
    tree = tree_tensors(TreeSpec((2, 2)))
    result = accept_greedy(torch.tensor([9, 4, 5, 6, 7]), one_hot_logits([4, 7, 0, 0, 3]), tree)
    assert result.path == [0, 1, 4] and result.next_token == 3
    assert len(acceptance._OP_FAILED) == 1 and "accepting on the host from now on" in caplog.text
    probs = torch.zeros(4, VOCAB)
    probs[0, 2] = probs[3, 5] = 1.0
    result = accept_sampled_tree(torch.tensor([9, 0, 1, 2]), probs, tree_tensors(TreeSpec((3,))),
                                 torch.Generator().manual_seed(0))
    assert result.path == [0, 3] and result.next_token == 5
    with pytest.raises(RuntimeError, match="no kernel image"):   # forced, the op's failure is the caller's
        accept_greedy(torch.tensor([9, 4, 5, 6, 7]), one_hot_logits([4, 7, 0, 0, 3]), tree, on_device=True)


def test_sampled_tree_with_certain_target_accepts_the_matching_sibling():
    tree = tree_tensors(TreeSpec((3,)))
    probs = torch.zeros(4, VOCAB)
    probs[0, 2] = 1.0
    probs[3, 5] = 1.0
    result = accept_sampled_tree(torch.tensor([9, 0, 1, 2]), probs, tree, torch.Generator().manual_seed(0))
    assert result.path == [0, 3] and result.next_token == 5


def test_kv_commit_moves_accepted_rows_into_place():
    cache = KVCache(num_layers=1, kv_heads=1, head_dim=1, max_seq_len=8, dtype=torch.float32)
    for cache_tensor in cache.tensors:
        cache_tensor[0, 0, :, 0] = torch.arange(9, dtype=torch.float32)
    cache.commit(base=2, accepted_offsets=[0, 2, 5])
    assert cache.tensors[0][0, 0, :, 0].tolist()[:5] == [0, 1, 2, 4, 7]


def test_stats_report_m_alpha_and_ctar():
    stats = GenerationStats(new_tokens=10, target_forward_passes=4, drafted_tokens=12, accepted_tokens=6,
                            accepted_per_round=[3, 0, 3], wall_seconds=2.0)
    data = stats.to_json()
    assert data["mean_accepted_length"] == 2.5 and data["acceptance_rate"] == 0.5
    assert data["ctar"]["1"] == 2 / 3 and data["ctar"]["4"] == 0.0
    assert data["tokens_per_second"] == 5.0
    assert GenerationStats().acceptance_rate is None


def test_an_engine_generates_the_same_tokens_through_the_acceptance_ops(checkpoints, tmp_path, monkeypatch):
    """generate() with acceptance on the op path (as on CUDA; here the interpreted kernels): the
    tokens the op returns with the path replace the draft lookup, and greedy output is unchanged."""
    import specc.runtime.acceptance as acceptance
    from specc.compiler import CompileRequest, compile_engine
    from specc.engine.loaded import load_engine
    from specc.contract.sampling import SamplingConfig
    from specc.testing.checkpoints import varied_prompts

    target, draft = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="draft-model", output=tmp_path / "engine", max_seq_len=64,
                                  settings=["num_draft_tokens=3", "tree_width=2", f"draft_model={draft}"]))
    engine = load_engine(tmp_path / "engine")
    prompts = varied_prompts(3, 96, seed=5)
    host = [engine.generate_ids(ids, 12) for ids in prompts]
    calls = []
    on_device = acceptance._accept_greedy_on_device
    monkeypatch.setattr(acceptance, "_accept_greedy_on_device", lambda *args: calls.append(1) or on_device(*args))
    monkeypatch.setattr(acceptance, "_use_op", lambda on_device, scores: on_device is not False)   # as on CUDA
    through_op = [engine.generate_ids(ids, 12) for ids in prompts]
    assert [r.token_ids for r in through_op] == [r.token_ids for r in host]
    assert calls and sum(r.stats.accepted_tokens for r in through_op) > 0
    sampled = engine.generate_ids(prompts[0], 12, SamplingConfig(temperature=1.0, seed=0))   # sample_accept
    assert 1 <= len(sampled.token_ids) <= 12 and sampled.stats.drafted_tokens > 0
