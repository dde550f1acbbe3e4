"""tree_attention: the Triton kernel (interpreted) and the PyTorch reference
against SDPA, and the operator through torch.export and Inductor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import specc.kernels  # noqa: F401  (registers torch.ops.specc.*)
from specc.kernels import reference
from specc.runtime.masks import causal_chunk_mask, tree_mask
from specc.runtime.tree import TreeSpec, tree_tensors

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(MASKS))
def test_kernel_and_reference_match_sdpa(triton_kernels, case, dtype):
    heads, kv_heads, head_dim, mask = MASKS[case]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim, dtype)
    expected = sdpa(query, key, value, mask)
    kernel = triton_kernels("tree_attention").tree_attention(query, key, value, mask)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(kernel, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(reference.tree_attention(query, key, value, mask), expected,
                               rtol=tolerance, atol=tolerance)
    assert kernel.dtype == dtype and kernel.shape == query.shape


def test_bf16_upcast_inside_the_kernel(triton_kernels):
    heads, kv_heads, head_dim, mask = MASKS["gqa tree, q not a block multiple"]
    query, key, value = attention_inputs(heads, kv_heads, mask, head_dim, torch.bfloat16)
    exact = sdpa(query.double(), key.double(), value.double(), mask)
    kernel = triton_kernels("tree_attention").tree_attention(query, key, value, mask)
    assert kernel.dtype == torch.bfloat16
    torch.testing.assert_close(kernel.double(), exact, rtol=TOLERANCE[torch.bfloat16], atol=TOLERANCE[torch.bfloat16])


def test_additive_mask_scale_and_fully_masked_rows(triton_kernels):
    mask = specc_tree_mask(9, (2, 2))
    mask[..., 1, :] = False   # a row that may attend to nothing: SDPA gives zeros
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    query, key, value = attention_inputs(4, 1, mask, 16)
    kernel = triton_kernels("tree_attention").tree_attention
    for given in (mask, additive):
        out = kernel(query, key, value, given, 0.3)
        torch.testing.assert_close(out, sdpa(query, key, value, mask, scale=0.3), rtol=1e-5, atol=1e-5)
        assert not out.isnan().any() and out[:, :, 1].eq(0).all()


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
