"""ONNX translations of specc's kernels, for `specc.lower.onnx.ONNX_TRANSLATIONS`.

`specc::tree_attention` is written out in ONNX operators (opset 18) the way
`specc.kernels.reference.tree_attention` computes it: keys and values
repeated per query group (GQA), fp32 scores `q·kᵀ·scale`, positions the
boolean mask forbids set to -inf (an additive float mask is added
instead), softmax over kv with rows that may attend to nothing giving
zeros, times the values, cast back to the query's dtype. With `kv_len` (the
live length `use_kernels` computes), keys at and past it are set to -inf too.

`specc::greedy_accept` needs none: the runtime calls it outside any graph.

onnxscript is imported only when the translation runs (at export), so
importing this module needs torch alone.
"""

from __future__ import annotations

import math


def tree_attention(query, key, value, mask, scale: float | None = None, kv_len=None):
    """Traced by the exporter: inputs are onnxscript values of known rank, dtype and static
    head counts and head_dim; q and kv may be symbolic."""
    from onnxscript import ir
    from onnxscript import opset18 as op

    heads, head_dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    floats = ir.DataType.FLOAT
    q = op.Cast(query, to=floats)
    k = _repeat_kv(op, op.Cast(key, to=floats), heads // kv_heads)
    v = _repeat_kv(op, op.Cast(value, to=floats), heads // kv_heads)
    scores = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])),
                    op.Constant(value=ir.tensor(scale, dtype=floats)))
    if mask.dtype == ir.DataType.BOOL:
        scores = op.Where(mask, scores, op.Constant(value=ir.tensor(float("-inf"), dtype=floats)))
    else:
        scores = op.Add(scores, op.Cast(mask, to=floats))
    if kv_len is not None:
        longs = ir.DataType.INT64
        slots = op.Squeeze(op.Shape(key, start=2, end=3))
        cols = op.Range(op.Constant(value=ir.tensor(0, dtype=longs)), slots,
                        op.Constant(value=ir.tensor(1, dtype=longs)))
        scores = op.Where(op.Less(cols, op.Cast(kv_len, to=longs)), scores,
                          op.Constant(value=ir.tensor(float("-inf"), dtype=floats)))
    weights = op.Softmax(scores, axis=-1)
    weights = op.Where(op.IsNaN(weights), op.Constant(value=ir.tensor(0.0, dtype=floats)), weights)
    return op.CastLike(op.MatMul(weights, v), query)


def _repeat_kv(op, states, group: int):
    """`[b, kv_heads, kv, d]` -> `[b, kv_heads * group, kv, d]`, each head repeated `group`
    times in place (`repeat_interleave(group, dim=1)`)."""
    if group == 1:
        return states
    shape = op.Shape(states)
    expanded = op.Expand(op.Unsqueeze(states, op.Constant(value_ints=[2])),
                         op.Constant(value_ints=[1, 1, group, 1, 1]))
    heads = op.Mul(op.Shape(states, start=1, end=2), op.Constant(value_ints=[group]))
    return op.Reshape(expanded, op.Concat(op.Shape(states, start=0, end=1), heads,
                                          op.Slice(shape, op.Constant(value_ints=[2]), op.Constant(value_ints=[4])),
                                          axis=0))
