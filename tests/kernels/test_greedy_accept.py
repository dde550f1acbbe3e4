"""greedy_accept: the reference agrees with specc's acceptor on its trees, and
the Triton kernels (interpreted) agree with the reference on any tree."""

from __future__ import annotations

import pytest
import torch

import specc.kernels  # noqa: F401  (registers torch.ops.specc.*)
from specc.contract.tree import TreeSpec, tree_tensors
from specc.kernels import reference
from specc.runtime.acceptance import accept_greedy


def random_spec(generator: torch.Generator) -> TreeSpec:
    depth = int(torch.randint(1, 6, (), generator=generator))
    return TreeSpec(tuple(torch.randint(1, 4, (depth,), generator=generator).tolist()))


def drafted_round(parents: list[int], vocab: int, generator: torch.Generator, agreement: float = 0.7):
    """Logits with ties (few distinct values) and node tokens that carry their
    parent's argmax with probability `agreement`, so paths of every length occur."""
    logits = torch.randint(0, 4, (len(parents), vocab), generator=generator).float()
    best = logits.argmax(dim=-1)
    tokens = torch.randint(0, vocab, (len(parents),), generator=generator)
    for node, parent in enumerate(parents[1:], start=1):
        if float(torch.rand((), generator=generator)) < agreement:
            tokens[node] = best[parent]
    return logits, tokens, torch.tensor(parents)


def random_parents(nodes: int, generator: torch.Generator) -> list[int]:
    """Any tree whose parents come before their children (not only specc's caterpillars)."""
    return [-1] + [int(torch.randint(0, node, (), generator=generator)) for node in range(1, nodes)]


def test_reference_agrees_with_specc_acceptor_on_random_trees():
    generator = torch.Generator().manual_seed(0)
    lengths = set()
    for _ in range(300):
        tree = tree_tensors(random_spec(generator))
        logits, tokens, parents = drafted_round(list(tree.parent), 12, generator)
        path, bonus = reference.greedy_accept(logits, tokens, parents)
        expected = accept_greedy(tokens, logits, tree)
        accepted = path[path >= 0].tolist()
        assert accepted == expected.path and int(bonus) == expected.next_token
        assert path[len(accepted):].eq(-1).all()
        lengths.add(len(accepted))
    assert len(lengths) >= 4, f"random rounds should accept paths of many lengths, got {sorted(lengths)}"


@pytest.mark.parametrize("vocab", [37, 2500])   # 2500: argmax across vocabulary blocks, ties between them
def test_kernel_agrees_with_reference(triton_kernels, vocab):
    kernel = triton_kernels("greedy_accept")
    generator = torch.Generator().manual_seed(vocab)
    trees = [list(tree_tensors(random_spec(generator)).parent) for _ in range(3)]
    trees += [random_parents(9, generator), [-1]]
    for parents in trees:
        logits, tokens, parents = drafted_round(parents, vocab, generator)
        path, bonus = kernel.greedy_accept(logits, tokens, parents)
        expected_path, expected_bonus = reference.greedy_accept(logits, tokens, parents)
        assert path.tolist() == expected_path.tolist() and int(bonus) == int(expected_bonus)
        assert path.dtype == bonus.dtype == torch.int64 and bonus.dim() == 0


def test_the_op_on_cpu_matches_the_acceptor_in_half_precision(triton_kernels):
    tree = tree_tensors(TreeSpec((3, 2, 2)))
    logits, tokens, parents = drafted_round(list(tree.parent), 50, torch.Generator().manual_seed(5), agreement=0.9)
    path, bonus = torch.ops.specc.greedy_accept(logits.half(), tokens, parents)
    expected = accept_greedy(tokens, logits, tree)
    assert path[path >= 0].tolist() == expected.path and int(bonus) == expected.next_token


def test_inputs_out_of_order_or_of_the_wrong_kind_are_named():
    logits = torch.zeros(3, 5)
    with pytest.raises(ValueError, match="node 2 has parent 2"):
        torch.ops.specc.greedy_accept(logits, torch.zeros(3, dtype=torch.int64), torch.tensor([-1, 0, 2]))
    with pytest.raises(ValueError, match="node_tokens must be int64"):
        torch.ops.specc.greedy_accept(logits, torch.zeros(3, dtype=torch.int32), torch.tensor([-1, 0, 1]))


def test_export_keeps_the_padded_static_shapes():
    class Accept(torch.nn.Module):
        def forward(self, logits, tokens, parents):
            return torch.ops.specc.greedy_accept(logits, tokens, parents)

    tree = tree_tensors(TreeSpec((2, 2)))
    inputs = drafted_round(list(tree.parent), 20, torch.Generator().manual_seed(2))
    exported = torch.export.export(Accept(), inputs)
    path, bonus = exported.module()(*inputs)
    expected = accept_greedy(inputs[1], inputs[0], tree)
    assert path.shape == (tree.spec.num_nodes,) and path[path >= 0].tolist() == expected.path
    assert int(bonus) == expected.next_token
