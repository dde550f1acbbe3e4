"""sample_accept: the Triton kernel (interpreted) agrees draw for draw with the reference on
random chains and trees, and through the runtime's acceptors (`on_device=True`) the emitted
tokens keep the target's distribution (chi-square), where an acceptor that keeps every draft
token does not. The distribution tests run the op's reference (thousands of rounds are too
slow for the interpreter); the kernel equals it draw for draw."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import specc.kernels  # noqa: F401  (registers torch.ops.specc.*)
from specc.contract.tree import TreeSpec, tree_tensors
from specc.kernels import reference
from specc.runtime.acceptance import accept_sampled_chain, accept_sampled_tree


def random_probs(rows: int, vocab: int, generator: torch.Generator, sparsity: float = 0.3) -> torch.Tensor:
    """Rows of a distribution with some exact zeros (as top-p leaves them)."""
    weights = torch.rand(rows, vocab, generator=generator) ** 3
    weights[torch.rand(rows, vocab, generator=generator) < sparsity] = 0.0
    weights[:, 0] += 1e-3   # never an empty row
    return weights / weights.sum(dim=-1, keepdim=True)


def random_tree(generator: torch.Generator) -> list[int]:
    nodes = int(torch.randint(1, 12, (), generator=generator))
    return [-1] + [int(torch.randint(0, node, (), generator=generator)) for node in range(1, nodes)]


@pytest.mark.parametrize("vocab", [11, 1500])   # 1500: the draw crosses vocabulary blocks
def test_kernel_agrees_with_reference_draw_for_draw(triton_kernels, vocab):
    kernel = triton_kernels("sample_accept")
    generator = torch.Generator().manual_seed(vocab)
    lengths = set()
    for trial in range(60):
        chain = trial % 2 == 0
        depth = int(torch.randint(0, 6, (), generator=generator))
        parents = list(range(-1, depth)) if chain else random_tree(generator)
        nodes = len(parents)
        probs = random_probs(nodes, vocab, generator)
        drafts = random_probs(nodes - 1, vocab, generator) if chain else None
        # tokens likely under p (so some are accepted), and repeated siblings in trees
        tokens = torch.multinomial(probs[[max(p, 0) for p in parents]], 1, generator=generator)[:, 0]
        if not chain and nodes > 3:
            tokens[nodes - 1] = tokens[nodes - 2]
        uniforms = torch.rand(nodes + 1, generator=generator)
        inputs = (probs, tokens, torch.tensor(parents), uniforms, drafts)
        path, token = kernel.sample_accept(*inputs)
        expected_path, expected_token = reference.sample_accept(*inputs)
        assert path.tolist() == expected_path.tolist() and int(token) == int(expected_token), trial
        assert path.dtype == token.dtype == torch.int64 and token.dim() == 0
        lengths.add(int((path >= 0).sum()))
    assert len(lengths) >= 3, f"random rounds should accept paths of several lengths, got {sorted(lengths)}"


def test_bad_inputs_are_named():
    probs = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="uniforms must be float32"):
        torch.ops.specc.sample_accept(probs, torch.zeros(3, dtype=torch.int64), torch.tensor([-1, 0, 1]),
                                      torch.rand(3))
    with pytest.raises(ValueError, match="draft_probs"):
        torch.ops.specc.sample_accept(probs, torch.zeros(3, dtype=torch.int64), torch.tensor([-1, 0, 1]),
                                      torch.rand(4), torch.full((3, 4), 0.25))


VOCAB = 6
TRIALS = 3000


@pytest.fixture
def op_reference(monkeypatch):
    """The op runs its PyTorch reference on CPU tensors."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of `counts` under `probs`, cells with expected count < 5 pooled."""
    counts = counts.double()
    expected = probs.double() / probs.double().sum() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum(dim=0, keepdim=True)])
    wanted = torch.cat([expected[big], expected[~big].sum(dim=0, keepdim=True)])
    keep = wanted > 0
    observed, wanted = observed[keep], wanted[keep]
    return float(chisquare(observed.numpy(), wanted.numpy() * (observed.sum() / wanted.sum()).item()).pvalue)


def test_sampled_chain_keeps_the_target_distribution(op_reference):
    """Chains sampled from q (x1 ~ q0, x2 ~ q1 | x1): the first emitted token is distributed as
    p0 through the op; keeping every draft token would give q0."""
    generator = torch.Generator().manual_seed(0)
    target = random_probs(3, VOCAB, generator, sparsity=0.0)
    draft = random_probs(2, VOCAB, generator, sparsity=0.0)
    draws = torch.Generator().manual_seed(1)
    first = torch.zeros(VOCAB)
    broken = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        chain = [0] + [int(torch.multinomial(draft[d], 1, generator=draws)) for d in range(2)]
        result = accept_sampled_chain(torch.tensor(chain), draft, target, draws, on_device=True)
        assert result.accepted_tokens == chain[1:len(result.path)]
        first[result.accepted_tokens[0] if result.accepted_tokens else result.next_token] += 1
        broken[chain[1]] += 1
    assert chi_square(first, target[0]) > 1e-3
    assert chi_square(broken, target[0]) < 1e-6, "the test must catch an acceptor that keeps every draft token"


def test_sampled_tree_keeps_the_target_distribution(op_reference):
    """A caterpillar of fixed candidates (two, one of them repeated, then two under the first):
    the first emitted token is distributed as the root's p, and after the first chain node is
    accepted, the next token as that node's p."""
    tree = tree_tensors(TreeSpec((3, 2)))   # root 0; depth 1: 1 (chain), 2, 3; depth 2: 4, 5 under 1
    generator = torch.Generator().manual_seed(2)
    target = random_probs(tree.spec.num_nodes, VOCAB, generator, sparsity=0.0)
    tokens = torch.tensor([0, 1, 4, 1, 2, 3])   # node 3 repeats node 1's token: it can never be accepted
    draws = torch.Generator().manual_seed(3)
    first, second = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for _ in range(TRIALS):
        result = accept_sampled_tree(tokens, target, tree, draws, on_device=True)
        assert 3 not in result.path
        emitted = [*result.accepted_tokens, result.next_token]
        first[emitted[0]] += 1
        if result.path[1:2] == [1]:
            second[emitted[1]] += 1
    assert chi_square(first, target[0]) > 1e-3
    assert second.sum() > 100 and chi_square(second, target[1]) > 1e-3
