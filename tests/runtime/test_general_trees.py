"""Trees of any shape (`tree_from_parents`): their tensors, the acceptance walks and ops
over them, and the chain an exactness cap keeps of them."""

from __future__ import annotations

import pytest
import torch

from specc.contract.drafter import Draft
from specc.contract.tree import TreeSpec, tree_from_parents, tree_tensors
from specc.runtime.acceptance import accept_greedy, accept_sampled_tree
from specc.runtime.exact_chain import exact_chain
from specc.testing.checkpoints import assert_distribution

# root 0 -> 1, 2; 1 -> 3; 2 -> 4, 5; 4 -> 6: no caterpillar (node 2, not the first child, has children)
PARENTS = (-1, 0, 0, 1, 2, 2, 4)
VOCAB = 10


def test_a_tree_of_any_shape_has_its_levels_children_and_mask():
    tree = tree_from_parents(PARENTS)
    assert tree.parent == PARENTS
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.spec == TreeSpec((2, 3, 1)) and tree.spec.num_nodes == 7
    assert tree.level_nodes == ((1, 2), (3, 4, 5), (6,))
    assert [tree.children(node) for node in range(7)] == [(1, 2), (3,), (4, 5), (), (6,), (), ()]
    assert tree.chain_nodes == (1, 3), "the first-child path from the root"
    assert tree.paths == ((0, 1, 3), (0, 2, 5), (0, 2, 4, 6)), "root to each leaf, leaves in node order"
    assert tree.ancestor_mask[6].tolist() == [True, False, True, False, True, False, True]
    assert tree.ancestor_mask.sum(dim=1).tolist() == [1, 2, 2, 3, 3, 3, 4]
    assert tree_from_parents(PARENTS) is tree, "tree tensors are built once per shape"


def test_the_first_child_path_follows_node_order_not_depth():
    tree = tree_from_parents((-1, 0, 0, 2, 1))   # node 1's child (4) comes after node 2's (3)
    assert tree.chain_nodes == (1, 4) and tree.children(0) == (1, 2) and tree.children(1) == (4,)


@pytest.mark.parametrize("widths", [(), (1,), (3,), (2, 3), (1, 2, 1), (3, 1, 2, 2)])
def test_a_caterpillar_is_the_tree_of_its_parents(widths):
    caterpillar = tree_tensors(TreeSpec(widths))
    general = tree_from_parents(caterpillar.parent)
    assert (general.spec, general.level_nodes, general.chain_nodes) == (
        caterpillar.spec, caterpillar.level_nodes, caterpillar.chain_nodes)
    assert torch.equal(general.depth, caterpillar.depth)
    assert torch.equal(general.ancestor_mask, caterpillar.ancestor_mask)
    assert all(general.children(n) == caterpillar.children(n) for n in range(caterpillar.spec.num_nodes))


@pytest.mark.parametrize("parents,fault", [
    ((), "root"), ((0, 0), "root"), ((-1, 1), "node 1 has parent 1"), ((-1, 0, 3, 1), "node 2 has parent 3"),
    ((-1, 0, -1), "node 2 has parent -1"),
])
def test_parents_out_of_order_are_refused(parents, fault):
    with pytest.raises(ValueError, match=fault):
        tree_from_parents(parents)


def one_hot_logits(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), VOCAB)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


@pytest.mark.parametrize("on_device", [False, True])
def test_greedy_follows_a_branch_below_a_later_sibling(on_device):
    tree = tree_from_parents(PARENTS)
    node_tokens = torch.tensor([9, 1, 2, 3, 4, 5, 6])
    # after the root the target says 2 (node 2, not the first child), then 4 (node 4), then 6, then 8
    result = accept_greedy(node_tokens, one_hot_logits([2, 0, 4, 0, 6, 0, 8]), tree, on_device=on_device)
    assert result.path == [0, 2, 4, 6] and result.next_token == 8


def random_parents(generator: torch.Generator) -> tuple[int, ...]:
    nodes = int(torch.randint(2, 12, (), generator=generator))
    return (-1, *(int(torch.randint(0, node, (), generator=generator)) for node in range(1, nodes)))


def test_greedy_on_the_device_path_accepts_what_the_host_walk_accepts_on_any_tree():
    generator = torch.Generator().manual_seed(1)
    lengths = set()
    for _ in range(60):
        tree = tree_from_parents(random_parents(generator))
        n = len(tree.parent)
        logits = torch.randint(0, 4, (n, VOCAB), generator=generator).float()
        best = logits.argmax(dim=-1)
        tokens = torch.randint(0, VOCAB, (n,), generator=generator)
        for node, parent in enumerate(tree.parent[1:], start=1):
            if float(torch.rand((), generator=generator)) < 0.6:
                tokens[node] = best[parent]
        host = accept_greedy(tokens, logits, tree, on_device=False)
        on_device = accept_greedy(tokens, logits, tree, on_device=True)
        assert (on_device.path, on_device.next_token) == (host.path, host.next_token)
        lengths.add(len(host.path))
    assert len(lengths) >= 3, f"random rounds should accept paths of many lengths, got {sorted(lengths)}"


# --- sampling: point-mass acceptance over a general tree keeps the target's distribution -------

SAMPLED_VOCAB = 4
# node tokens of PARENTS: siblings differ, and tokens repeat across branches
SAMPLED_TOKENS = [0, 1, 0, 2, 1, 3, 0]


def target_distribution(prefix: tuple[int, ...]) -> torch.Tensor:
    """A fixed, peaked distribution for every context (what the target predicts after it)."""
    seed = sum((token + 1) * 7 ** i for i, token in enumerate(prefix))
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(2.0 * torch.randn(SAMPLED_VOCAB, generator=generator), dim=0)


def node_contexts(tree, tokens: list[int]) -> list[tuple[int, ...]]:
    contexts = [()]
    for node in range(1, len(tokens)):
        contexts.append(contexts[tree.parent[node]] + (tokens[node],))
    return contexts


def first_two_tokens(tree, generator: torch.Generator, on_device: bool, lengths: set) -> tuple[int, int]:
    """Rounds of the same drafted tree after the emitted tokens until two tokens are out."""
    emitted: list[int] = []
    while len(emitted) < 2:
        contexts = node_contexts(tree, SAMPLED_TOKENS)
        probs = torch.stack([target_distribution(tuple(emitted) + context) for context in contexts])
        result = accept_sampled_tree(torch.tensor(SAMPLED_TOKENS), probs, tree, generator, on_device=on_device)
        lengths.add(len(result.path))
        emitted += [SAMPLED_TOKENS[node] for node in result.path[1:]] + [result.next_token]
    return emitted[0], emitted[1]


@pytest.mark.parametrize("on_device", [False, True])
def test_sampled_acceptance_on_a_general_tree_keeps_the_target_distribution(on_device, monkeypatch):
    """The host walk, and the sample_accept op through its PyTorch reference (thousands of rounds
    are too slow for Triton's interpreter; tests/kernels checks the kernel equals the reference
    draw for draw on random trees of any shape)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    tree = tree_from_parents(PARENTS)
    generator = torch.Generator().manual_seed(3)
    counts = torch.zeros(SAMPLED_VOCAB * SAMPLED_VOCAB)
    lengths: set[int] = set()
    for _ in range(3000):
        first, second = first_two_tokens(tree, generator, on_device, lengths)
        counts[first * SAMPLED_VOCAB + second] += 1
    first = target_distribution(())
    expected = torch.stack([first[a] * target_distribution((a,)) for a in range(SAMPLED_VOCAB)]).flatten()
    assert_distribution(counts, expected, "first two tokens")
    assert {1, 3, 4} <= lengths, f"the walk should stop at every depth, including below node 2; got {lengths}"


# --- the chain an exactness cap keeps -------------------------------------------------------------


def test_exact_chain_keeps_the_first_ranked_path_of_a_general_tree():
    scores = torch.tensor([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    draft = Draft(tree=tree_from_parents(PARENTS), node_tokens=torch.tensor([10, 11, 12, 13, 14, 15, 16]),
                  node_scores=scores)
    chain = exact_chain(draft)
    assert chain.tree.spec == TreeSpec.chain(2) and chain.tree.parent == (-1, 0, 1)
    assert chain.node_tokens.tolist() == [10, 11, 13]
    assert chain.node_scores.tolist() == pytest.approx([1.0, 0.9, 0.7])


def test_a_general_tree_of_one_node_per_depth_is_a_chain_already():
    draft = Draft(tree=tree_from_parents((-1, 0, 1, 2)), node_tokens=torch.tensor([1, 2, 3, 4]))
    assert exact_chain(draft) is draft
