"""Acceptance rules on hand-built trees, and the static tree tensors."""

from __future__ import annotations

import torch

from specc.runtime.acceptance import accept_greedy, accept_sampled_tree
from specc.runtime.kv_cache import KVCache
from specc.runtime.masks import causal_chunk_mask, tree_mask
from specc.runtime.stats import GenerationStats
from specc.runtime.tree import TreeSpec, tree_tensors

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
