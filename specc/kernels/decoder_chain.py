"""`torch.ops.specc.decoder_chain`: a decoder layer's chain from its attention's output to the
next layer's projection, on the CPU, in one parallel region (`cpu/decoder_chain.cpp`, compiled
into specc's CPU library, which registers it as the operator's CPU implementation:
`cpu/torch_ops.cpp`).

For rows `attention` and `residual` `[n, hidden]` (bfloat16) and the layer's weights packed for
`blocked_matmul` and laid out by `pack_layer` (one buffer: for each thread of the region it was
packed for, its share of o's tiles, then of gate's, up's, down's and next's, so that a thread reads
one run of memory a layer; a region of other threads computes the same bits) it returns
`(residual_out, next)`:

    h = residual + attention @ o            (rounded to bfloat16, as each step below)
    x = rms_norm(h, post_norm, eps)
    a = silu(x @ gate) * (x @ up)           (gate_up: gate's features, then up's)
    residual_out = h + a @ down
    next = rms_norm(residual_out, next_norm, eps) @ next_weight

which is what a Llama or Qwen2 decoder layer computes from the attention's output up to the
next layer's q/k/v projection, before its bias (`fuse_decoder_chain` puts it in their
place). `torch.ops.specc.decoder_chain_into_cache` takes the same operands and goes on to the
next attention's operands: the projection plus `next_bias` where given (Qwen2's q, k and v biases
end to end, the sum rounded to bfloat16 as eager's add), the rotary embedding on q
and k (`cos`, `sin` `[rows, head_dim]`, Llama's rotate-half form, in eager bfloat16 steps), k and
v written into `k_cache` and `v_cache` `[1, kv_heads, capacity, head_dim]` at each row's
`cache_positions` entry, and returns `(residual_out, query)` with `query` `[rows, heads *
head_dim]`. `torch.ops.specc.decoder_layer` runs the layer's row attention first (`query`,
`key`, `value`, `mask` and `scale` as `row_attention` takes them; its output is the chain's
`attention`), so a layer after the first is one call; `torch.ops.specc.decoder_stack` runs
several such layers of one shape in turn in one call. Each row is computed on its own, so a
row's bits never depend on the call's other rows.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from specc.kernels.blocked_matmul import BLOCK, TILE, reference as matmul_reference, tile_bytes as blocked_tile_bytes
from specc.kernels.cpu.build import NATIVE, load_library

LIBRARY = NATIVE


def _pointer(tensor: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(tensor.data_ptr() if tensor is not None else None)


def _features(packed: torch.Tensor) -> int:
    return packed.shape[0] * TILE


def tile_share(tiles: int, threads: int, thread: int) -> tuple[int, int]:
    """Thread `thread`'s range [first, last) of `tiles` among `threads` (OpenMP's static schedule):
    the share each of specc's CPU kernels gives a thread."""
    share, longer = divmod(tiles, threads)
    first = thread * share + min(thread, longer)
    return first, first + share + (1 if thread < longer else 0)


def pack_layer(o_weight, gate_up_weight, down_weight, next_weight, threads: int) -> torch.Tensor:
    """A layer's four packed projections as the chain operators take them: for each of `threads`
    threads in turn, its share of o's tiles, then gate's, up's, down's and next's (gate_up: gate's
    tiles, then up's), so that in a region of that many threads each reads one run of memory a layer."""
    if threads < 1:
        raise ValueError(f"a layer is packed for one thread or more, not {threads}")
    if gate_up_weight.shape[0] % 2:
        raise ValueError(f"gate_up_weight holds gate's tiles then up's, an even count, not {gate_up_weight.shape[0]}")
    half = gate_up_weight.shape[0] // 2
    phases = (o_weight, gate_up_weight[:half], gate_up_weight[half:], down_weight, next_weight)
    parts = []
    for thread in range(threads):
        for weight in phases:
            first, last = tile_share(weight.shape[0], threads, thread)
            parts.append(weight[first:last].reshape(-1))
    return torch.cat(parts)


def layer_projections(hidden: int, intermediate: int, next_features: int,
                      bits: tuple[int, int, int, int]) -> list[tuple[int, int, int]]:
    """(bits, output features, inputs) of a layer pack's four projections: o, gate_up, down, next."""
    o_bits, gate_up_bits, down_bits, next_bits = bits
    return [(o_bits, hidden, hidden), (gate_up_bits, 2 * intermediate, hidden), (down_bits, hidden, intermediate),
            (next_bits, next_features, hidden)]


def layer_pack_bytes(hidden: int, intermediate: int, next_features: int, bits: tuple[int, int, int, int]) -> int:
    """Bytes of a layer's pack: its four projections' tiles (0 when a shape or bits do not fit)."""
    projections = layer_projections(hidden, intermediate, next_features, bits)
    if any(b not in (4, 6, 8) or features <= 0 or features % TILE or inputs <= 0 or inputs % BLOCK
           for b, features, inputs in projections):
        return 0
    return sum(features // TILE * blocked_tile_bytes(inputs, b) for b, features, inputs in projections)


def _run(attention, residual, weights, post_norm, next_norm, o_bits, gate_up_bits, down_bits, next_bits,
         intermediate, next_features, packed_threads, eps, scalar: bool = False):
    hidden = attention.shape[1]
    if residual.shape != attention.shape or residual.dtype != torch.bfloat16 or attention.dtype != torch.bfloat16:
        raise ValueError(f"decoder_chain takes bfloat16 attention and residual rows of one shape, got "
                         f"{attention.dtype} {list(attention.shape)} and {residual.dtype} {list(residual.shape)}")
    if any(v.dtype != torch.bfloat16 or v.shape != (hidden,) for v in (post_norm, next_norm)):
        raise ValueError(f"decoder_chain takes bfloat16 norm weights of {hidden}")
    expected = layer_pack_bytes(hidden, intermediate, next_features, (o_bits, gate_up_bits, down_bits, next_bits))
    if weights.dtype != torch.uint8 or weights.dim() != 1 or weights.numel() != expected or packed_threads < 1:
        raise ValueError(f"decoder_chain takes the layer's packed projections, uint8 of {expected} bytes packed "
                         f"for one thread or more, got {weights.dtype} {list(weights.shape)} for {packed_threads}")
    rows = attention.contiguous()
    residual_out = torch.empty_like(rows)
    next_out = rows.new_empty(rows.shape[0], next_features)
    post_norm, next_norm = post_norm.contiguous(), next_norm.contiguous()
    status = load_library(LIBRARY).specc_decoder_chain(
        _pointer(rows), _pointer(residual.contiguous()), rows.shape[0], hidden, _pointer(weights.contiguous()),
        packed_threads, o_bits, _pointer(post_norm), gate_up_bits, intermediate, down_bits, _pointer(next_norm),
        next_bits, next_features, ctypes.c_float(eps), _pointer(residual_out), _pointer(next_out), int(scalar))
    if status != 0:
        raise ValueError(f"decoder_chain refused its arguments (status {status})")
    return residual_out, next_out


torch.library.define(
    "specc::decoder_chain",
    "(Tensor attention, Tensor residual, Tensor weights, Tensor post_norm, Tensor next_norm, int o_bits, "
    "int gate_up_bits, int down_bits, int next_bits, int intermediate, int next_features, int packed_threads, "
    "float eps) -> (Tensor, Tensor)")


# The CPU implementation is C++ (`cpu/torch_ops.cpp`), registered when specc's CPU library loads;
# until then this one stands in: it loads the library and computes its call through ctypes.
@torch.library.impl("specc::decoder_chain", "CompositeExplicitAutograd")
def _decoder_chain_until_loaded(*args):
    return _run(*args)


@torch.library.register_fake("specc::decoder_chain")
def _decoder_chain_fake(attention, residual, weights, post_norm, next_norm, o_bits, gate_up_bits, down_bits,
                        next_bits, intermediate, next_features, packed_threads, eps):
    return attention.new_empty(attention.shape), attention.new_empty(attention.shape[0], next_features)


def decoder_chain(*args):
    """`(residual_out, next)` of the module docstring's chain."""
    return torch.ops.specc.decoder_chain.default(*args)


def _define_in_cpu_library(name: str, schema: str) -> None:
    """`torch.ops.specc.<name>`, whose CPU implementation is C++ (`cpu/torch_ops.cpp`), registered
    when specc's CPU library loads; until then a stand-in loads it and calls the operator again."""
    torch.library.define(f"specc::{name}", schema)

    @torch.library.impl(f"specc::{name}", "CompositeExplicitAutograd")
    def _until_loaded(*args):
        load_library(LIBRARY)
        return getattr(torch.ops.specc, name).default(*args)


def _residual_and_query_fake(residual: torch.Tensor, k_cache: torch.Tensor, heads: int):
    """`(residual_out, query)` as the operators taken on to the cache writes return them."""
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape[0], heads * k_cache.shape[3])


_define_in_cpu_library(
    "decoder_chain_into_cache",
    "(Tensor attention, Tensor residual, Tensor weights, Tensor post_norm, Tensor next_norm, int o_bits, "
    "int gate_up_bits, int down_bits, int next_bits, int intermediate, int next_features, int packed_threads, "
    "float eps, Tensor cos, Tensor sin, Tensor cache_positions, Tensor(a!) k_cache, Tensor(b!) v_cache, "
    "int heads, Tensor? next_bias=None) -> (Tensor, Tensor)")


@torch.library.register_fake("specc::decoder_chain_into_cache")
def _decoder_chain_into_cache_fake(*args):
    operands = named_operands(torch.ops.specc.decoder_chain_into_cache.default, args)
    return _residual_and_query_fake(operands["residual"], operands["k_cache"], operands["heads"])


def decoder_chain_into_cache(*args):
    """`(residual_out, query)` of the module docstring's chain taken on to the cache writes."""
    return torch.ops.specc.decoder_chain_into_cache.default(*args)


_define_in_cpu_library(
    "decoder_layer",
    "(Tensor query, Tensor key, Tensor value, Tensor mask, float scale, Tensor residual, Tensor weights, "
    "Tensor post_norm, Tensor next_norm, int o_bits, int gate_up_bits, int down_bits, int next_bits, "
    "int intermediate, int next_features, int packed_threads, float eps, Tensor cos, Tensor sin, "
    "Tensor cache_positions, Tensor(a!) k_cache, Tensor(b!) v_cache, int heads, Tensor? next_bias=None) "
    "-> (Tensor, Tensor)")


@torch.library.register_fake("specc::decoder_layer")
def _decoder_layer_fake(*args):
    operands = named_operands(torch.ops.specc.decoder_layer.default, args)
    return _residual_and_query_fake(operands["residual"], operands["k_cache"], operands["heads"])


def decoder_layer(*args):
    """`(residual_out, query)` of the layer's row attention and `decoder_chain_into_cache`, in one call."""
    return torch.ops.specc.decoder_layer.default(*args)


_define_in_cpu_library(
    "decoder_stack",
    "(Tensor query, Tensor mask, float scale, Tensor residual, Tensor[] weights, Tensor[] post_norms, "
    "Tensor[] next_norms, int[] bits, int intermediate, int next_features, int packed_threads, float eps, "
    "Tensor cos, Tensor sin, Tensor cache_positions, SymInt kv_length, Tensor(a!)[] k_caches, "
    "Tensor(b!)[] v_caches, int heads, Tensor[] next_biases) -> (Tensor, Tensor)")


@torch.library.register_fake("specc::decoder_stack")
def _decoder_stack_fake(*args):
    operands = named_operands(torch.ops.specc.decoder_stack.default, args)
    return _residual_and_query_fake(operands["residual"], operands["k_caches"][0], operands["heads"])


def decoder_stack(*args):
    """`(residual_out, query)` of `decoder_layer` run for several layers of one shape in turn, in one
    call: layer i takes the query and residual layer i - 1 returned, attends over the first
    `kv_length` positions of `k_caches[i]` and `v_caches[i]` and writes into `k_caches[i + 1]` and
    `v_caches[i + 1]`; `weights`, `post_norms`, `next_norms` and `next_biases` (or none) hold one
    entry a layer, `bits` each layer's o, gate_up, down and next bits in turn."""
    return torch.ops.specc.decoder_stack.default(*args)


OPERATORS = (torch.ops.specc.decoder_chain.default, torch.ops.specc.decoder_chain_into_cache.default,
             torch.ops.specc.decoder_layer.default)


def named_operands(operator, args) -> dict:
    """A call of one of `OPERATORS` as {argument name in its schema: value} (`weights`, `post_norm`,
    `o_bits`, ..., `intermediate`, `next_features`)."""
    return dict(zip((argument.name for argument in operator._schema.arguments), args))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding of `x` `[..., head_dim]` in eager bfloat16 steps."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def scalar_decoder_chain(*args):
    """The kernel's portable path, forced (what a CPU without AVX-512 runs): for tests."""
    return _run(*args, scalar=True)


def reference(attention, residual, o_weight, post_norm, gate_up_weight, down_weight, next_norm, next_weight,
              o_bits, gate_up_bits, down_bits, next_bits, eps):
    """The chain in PyTorch's eager bfloat16 steps around `blocked_matmul.reference` (its sums run in
    other orders, so it agrees with the kernel to a bfloat16 rounding here and there)."""
    def matmul(rows, packed, bits):
        return matmul_reference(rows, packed, bits, _features(packed)).to(torch.bfloat16)

    def rms_norm(x, weight):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)

    h = residual + matmul(attention, o_weight, o_bits)
    gate, up = matmul(rms_norm(h, post_norm), gate_up_weight, gate_up_bits).chunk(2, dim=-1)
    residual_out = h + matmul(F.silu(gate) * up, down_weight, down_bits)
    return residual_out, matmul(rms_norm(residual_out, next_norm), next_weight, next_bits)
