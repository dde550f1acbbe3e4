"""tree_attention: the Triton kernel (interpreted) and the PyTorch reference
against SDPA, and the operator through torch.export and Inductor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import specc.kernels  # noqa: F401  (registers torch.ops.specc.*)
from specc.contract.tree import TreeSpec, tree_tensors
from specc.kernels import reference
from specc.runtime.masks import causal_chunk_mask, tree_mask

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
CACHE_SLOTS = 48


def attention_inputs(heads: int, kv_heads: int, mask: torch.Tensor, head_dim: int, dtype=torch.float32, seed=0):
    """Query `[1, heads, q, d]` made by a transpose, and keys/values read as a
    view of the first kv slots of a larger cache, as the rewritten graphs have them."""
    q_len, kv_len = mask.shape[-2:]
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, q_len, heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    caches = torch.randn(2, 1, kv_heads, CACHE_SLOTS, head_dim, generator=generator).to(dtype)
    return query, caches[0, :, :, :kv_len], caches[1, :, :, :kv_len]


def sdpa(query, key, value, mask, scale=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=True)


def specc_tree_mask(prefix_len: int, widths: tuple[int, ...]) -> torch.Tensor:
    return tree_mask(prefix_len, tree_tensors(TreeSpec(widths)))


MASKS = {
    # name: (heads, kv_heads, head_dim, mask)
    "gqa tree, q not a block multiple": (4, 2, 16, specc_tree_mask(23, (3, 2, 2))),      # q 8, kv 31
    "prefill chunk over two q blocks": (2, 2, 8, causal_chunk_mask(5, 19)),              # q 19, kv 24
    "one decode step, wide groups": (6, 2, 24, causal_chunk_mask(33, 1)),               # q 1, kv 34
}


@pytest.mark.parametrize("split_kv", [None, 16])   # 16: several kv splits and the combine kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(MASKS))
def test_kernel_and_reference_match_sdpa(triton_kernels, case, dtype, split_kv):
    heads, kv_heads, head_dim, mask = MASKS[case]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim, dtype)
    expected = sdpa(query, key, value, mask)
    kernel = triton_kernels("tree_attention").tree_attention(query, key, value, mask, split_kv=split_kv)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(kernel, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(reference.tree_attention(query, key, value, mask), expected,
                               rtol=tolerance, atol=tolerance)
    assert kernel.dtype == dtype and kernel.shape == query.shape


def test_bf16_against_float64(triton_kernels):
    heads, kv_heads, head_dim, mask = MASKS["gqa tree, q not a block multiple"]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim, torch.bfloat16)
    exact = sdpa(query.double(), key.double(), value.double(), mask)
    kernel = triton_kernels("tree_attention").tree_attention(query, key, value, mask)
    assert kernel.dtype == torch.bfloat16
    torch.testing.assert_close(kernel.double(), exact, rtol=TOLERANCE[torch.bfloat16], atol=TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize("split_kv", [None, 16])
def test_additive_mask_scale_and_fully_masked_rows(triton_kernels, split_kv):
    mask = specc_tree_mask(25, (2, 2))
    mask[..., 1, :] = False   # a row that may attend to nothing: SDPA gives zeros
    mask[..., 2, :16] = False   # a row that sees nothing in the first split
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    query, key, value = attention_inputs(4, 1, mask, 16)
    kernel = triton_kernels("tree_attention").tree_attention
    for given in (mask, additive):
        out = kernel(query, key, value, given, 0.3, split_kv=split_kv)
        torch.testing.assert_close(out, sdpa(query, key, value, mask, scale=0.3), rtol=1e-5, atol=1e-5)
        assert not out.isnan().any() and out[:, :, 1].eq(0).all()


def stale_cache(heads: int, kv_heads: int, head_dim: int, q_len: int, live: int, slots: int, dtype, seed=0):
    """q rows over a cache of `slots` slots of which the first `live` hold tokens; the slots past
    them hold garbage (NaN and huge values) and the mask wrongly lets every row see them: only
    `kv_len` keeps them out."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, heads, q_len, head_dim, generator=generator).to(dtype)
    key, value = torch.randn(2, 1, kv_heads, slots, head_dim, generator=generator).to(dtype)
    key[:, :, live:] = float("nan")
    value[:, :, live:] = 1e30
    mask = causal_chunk_mask(live - q_len, q_len)
    mask = torch.cat([mask, torch.ones(1, 1, q_len, slots - live, dtype=torch.bool)], dim=-1)
    return query, key, value, mask


@pytest.mark.parametrize("split_kv", [None, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_len_attends_to_the_live_keys_only(triton_kernels, dtype, split_kv):
    heads, kv_heads, head_dim, live, slots = 6, 2, 24, 37, 90   # group 3, head_dim padded, live mid-split
    query, key, value, mask = stale_cache(heads, kv_heads, head_dim, 5, live, slots, dtype)
    kv_len = torch.tensor(live)
    expected = sdpa(query.double(), key[:, :, :live].double(), value[:, :, :live].double(), mask[..., :live])
    out = triton_kernels("tree_attention").tree_attention(query, key, value, mask, None, kv_len, split_kv=split_kv)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    # the reference (what the op runs without the kernel) masks the same keys
    torch.testing.assert_close(reference.tree_attention(query, key, value, mask, None, kv_len).double(), expected,
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    # past the cache, kv_len is clamped to it; at 0 every row attends to nothing
    assert torch.equal(triton_kernels("tree_attention").tree_attention(
        query, key[:, :, :live], value[:, :, :live], mask[..., :live], None, torch.tensor(10 * slots),
        split_kv=split_kv), out)
    assert triton_kernels("tree_attention").tree_attention(query, key, value, mask, None, torch.tensor(0)).eq(0).all()


def test_a_batch_of_two_with_per_batch_masks(triton_kernels):
    generator = torch.Generator().manual_seed(4)
    query = torch.randn(2, 6, 5, 24, generator=generator)
    key, value = torch.randn(2, 2, 2, 80, 24, generator=generator)
    mask = torch.rand(2, 1, 5, 80, generator=generator) < 0.7
    expected = sdpa(query, key[:, :, :70], value[:, :, :70], mask[..., :70])
    out = triton_kernels("tree_attention").tree_attention(query, key, value, mask, None, torch.tensor(70))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_cache_gives_the_bits_of_its_live_part(triton_kernels, dtype):
    """Split and tile boundaries are fixed multiples of the key axis: 200 slots holding 37
    tokens (four splits, three never read, the combine kernel) give bitwise the output of a
    37-slot cache (one split, normalised in place)."""
    query, key, value, mask = stale_cache(6, 2, 24, 5, 37, 200, dtype, seed=3)
    kernel = triton_kernels("tree_attention").tree_attention
    over_cache = kernel(query, key, value, mask, None, torch.tensor(37))
    over_live = kernel(query, key[:, :, :37].contiguous(), value[:, :, :37].contiguous(), mask[..., :37],
                       None, torch.tensor(37))
    assert torch.equal(over_cache, over_live)


def random_tree_mask(prefix_len: int, nodes: int, generator: torch.Generator) -> torch.Tensor:
    """`[1, 1, nodes, prefix_len + nodes]`: the prefix, then each node's ancestors in a random tree
    whose parents come before their children (so row i sees nothing past slot prefix_len + i)."""
    parents = [-1] + [int(torch.randint(0, node, (), generator=generator)) for node in range(1, nodes)]
    mask = torch.zeros(nodes, prefix_len + nodes, dtype=torch.bool)
    mask[:, :prefix_len] = True
    for node in range(nodes):
        walk = node
        while walk >= 0:
            mask[node, prefix_len + walk] = True
            walk = parents[walk]
    return mask[None, None]


@pytest.mark.parametrize(("dtype", "split_kv"), [(torch.bfloat16, None), (torch.float32, 32)])   # 2 and 4 splits
def test_rows_are_bitwise_the_same_whatever_the_number_of_rows(triton_kernels, row_independent_dot, dtype, split_kv):
    """Row i of an n-row call (kv_len = prefix + n) is bitwise row i called alone (kv_len =
    prefix + i + 1, its own mask row, as the decode step after its ancestors), for n up to 64:
    the reduction order over keys never depends on the rows or the tree."""
    heads, kv_heads, head_dim, prefix, most = 6, 2, 24, 41, 64   # group 3: rows straddle blocks
    generator = torch.Generator().manual_seed(7)
    mask = random_tree_mask(prefix, most, generator)
    query = (torch.randn(1, heads, most, head_dim, generator=generator) * 3).to(dtype)
    key, value = (torch.randn(2, 1, kv_heads, prefix + most, head_dim, generator=generator) * 3).to(dtype)
    kernel = triton_kernels("tree_attention").tree_attention

    def call(rows: slice, live: int):
        return kernel(query[:, :, rows], key, value, mask[:, :, rows], None, torch.tensor(live), split_kv=split_kv)

    alone = [call(slice(i, i + 1), prefix + i + 1) for i in range(most)]
    for n in (1, 2, 3, 6, 16, 17, 22, 43, 64):
        together = call(slice(0, n), prefix + n)
        for i in range(n):
            assert torch.equal(together[:, :, i:i + 1], alone[i]), f"row {i} of a {n}-row call differs"
    # the whole call also matches SDPA, so the rows compared are real attention outputs
    torch.testing.assert_close(together.double(), sdpa(query.double(), key.double(), value.double(), mask),
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def count_launches(monkeypatch, module) -> list:
    """Record each launch of `module.tree_attention`, the Triton launcher, and still run it."""
    launches, launch = [], module.tree_attention

    def counted(*args):
        launches.append(args)
        return launch(*args)

    monkeypatch.setattr(module, "tree_attention", counted)
    return launches


def test_the_op_runs_the_interpreted_kernel_on_cpu(triton_kernels, monkeypatch):
    launches = count_launches(monkeypatch, triton_kernels("tree_attention"))
    heads, kv_heads, head_dim, mask = MASKS["gqa tree, q not a block multiple"]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim)
    out = torch.ops.specc.tree_attention(query, key, value, mask)
    assert len(launches) == 1
    torch.testing.assert_close(out, sdpa(query, key, value, mask), rtol=1e-5, atol=1e-5)


def test_the_op_runs_the_reference_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    heads, kv_heads, head_dim, mask = MASKS["one decode step, wide groups"]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim)
    torch.testing.assert_close(torch.ops.specc.tree_attention(query, key, value, mask),
                               sdpa(query, key, value, mask), rtol=1e-5, atol=1e-5)


def test_gradients_match_sdpa(triton_kernels):
    heads, kv_heads, head_dim, mask = MASKS["gqa tree, q not a block multiple"]
    inputs = [t.detach().requires_grad_() for t in attention_inputs(heads, kv_heads, mask, head_dim)]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    weights = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1))
    (torch.ops.specc.tree_attention(*inputs, mask) * weights).sum().backward()
    (sdpa(*twins, mask) * weights).sum().backward()
    for ours, theirs in zip(inputs, twins):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_bad_shapes_are_named():
    mask = causal_chunk_mask(0, 3)
    query, key, value = attention_inputs(3, 2, mask, 8)
    with pytest.raises(ValueError, match="3 query heads are not a multiple of 2 kv heads"):
        torch.ops.specc.tree_attention(query, key, value, mask)
    query, key, value = attention_inputs(4, 2, mask, 8)
    with pytest.raises(ValueError, match=r"mask \(1, 1, 2, 3\) does not broadcast"):
        torch.ops.specc.tree_attention(query, key, value, mask[..., :2, :])


class AttentionBlock(torch.nn.Module):
    """A projection around the op, so export and Inductor have a graph to trace."""

    def forward(self, query, key, value, mask):
        return torch.ops.specc.tree_attention(query * 2.0, key, value, mask).sum(dim=1)


def test_export_with_dynamic_q_and_kv(triton_kernels):
    mask = specc_tree_mask(11, (2, 1))
    inputs = attention_inputs(4, 2, mask, 16)
    q, kv = Dim("q", min=1, max=32), Dim("kv", min=1, max=CACHE_SLOTS - 1)   # a view, never the whole cache
    exported = torch.export.export(AttentionBlock(), (*inputs, mask),
                                   dynamic_shapes=({2: q}, {2: kv}, {2: kv}, {2: q, 3: kv}))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.specc.tree_attention.default in targets
    assert torch.ops.aten.scaled_dot_product_attention.default not in targets
    other_mask = specc_tree_mask(20, (3, 2))     # other q and kv than at export
    other = attention_inputs(4, 2, other_mask, 16, seed=2)
    torch.testing.assert_close(exported.module()(*other, other_mask), AttentionBlock()(*other, other_mask))
    torch.testing.assert_close(exported.module()(*other, other_mask),
                               sdpa(other[0] * 2.0, *other[1:], other_mask).sum(dim=1), rtol=1e-5, atol=1e-5)


def test_inductor_calls_the_op(triton_kernels, monkeypatch):
    launches = count_launches(monkeypatch, triton_kernels("tree_attention"))
    torch._dynamo.reset()
    compiled = torch.compile(AttentionBlock(), backend="inductor", dynamic=True, fullgraph=True)
    for seed, mask in enumerate((specc_tree_mask(7, (2, 2)), causal_chunk_mask(9, 3))):
        inputs = attention_inputs(4, 2, mask, 16, seed=seed)
        torch.testing.assert_close(compiled(*inputs, mask), sdpa(inputs[0] * 2.0, *inputs[1:], mask).sum(dim=1),
                                   rtol=1e-5, atol=1e-5)
    assert len(launches) == 2


class LiveAttentionBlock(torch.nn.Module):
    """The op as `use_kernels` calls it: kv_len computed on the device from the slots written."""

    def forward(self, query, key, value, mask, slots):
        kv_len = slots.amax() + 1
        return torch.ops.specc.tree_attention(query * 2.0, key, value, mask, kv_len=kv_len).sum(dim=1)


def live_inputs(q_len: int, live: int, slots: int, seed: int):
    query, key, value, mask = stale_cache(4, 2, 16, q_len, live, slots, torch.float32, seed=seed)
    return query, key, value, mask, torch.arange(live - q_len, live)


def live_expected(query, key, value, mask, slots):
    live = int(slots.max()) + 1
    return sdpa(query * 2.0, key[:, :, :live], value[:, :, :live], mask[..., :live]).sum(dim=1)


def test_kv_len_through_export_and_inductor(triton_kernels, monkeypatch):
    launches = count_launches(monkeypatch, triton_kernels("tree_attention"))
    q, kv = Dim("q", min=1, max=32), Dim("kv", min=2, max=128)
    exported = torch.export.export(LiveAttentionBlock(), live_inputs(3, 20, 40, seed=0),
                                   dynamic_shapes=({2: q}, {2: kv}, {2: kv}, {2: q, 3: kv}, {0: q}))
    assert torch.ops.specc.tree_attention.default in [n.target for n in exported.graph.nodes]
    torch._dynamo.reset()
    compiled = torch.compile(LiveAttentionBlock(), backend="inductor", dynamic=True, fullgraph=True)
    for seed, (q_len, live, slots) in enumerate([(5, 33, 70), (1, 9, 64)]):
        inputs = live_inputs(q_len, live, slots, seed)
        for run in (exported.module(), compiled):
            out = run(*inputs)
            assert not out.isnan().any()
            torch.testing.assert_close(out, live_expected(*inputs), rtol=1e-5, atol=1e-5)
    assert len(launches) == 4 and all(torch.is_tensor(args[5]) and args[5].dim() == 0 for args in launches)
