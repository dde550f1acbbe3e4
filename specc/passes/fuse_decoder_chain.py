"""Run each decoder layer's chain after its attention as one call of specc's CPU kernel.

Under specc's blocked kernels (`q4`/`q6`/`q8`) a decoder layer of the Llama form, from its
attention's output to the next layer's projection, is four matmul calls with three small
kernels between them:

    h = residual + reshape(blocked_matmul(attention, o))
    x = rms_norm(h, post_norm)            (to float32, pow 2, mean, + eps, rsqrt, mul, to bfloat16, weight *)
    gate_up = blocked_matmul(reshape(x), gate_up)
    act = silu(reshape(gate_up[:, :I])) * reshape(gate_up[:, I:])
    residual_out = h + reshape(blocked_matmul(reshape(act), down))
    next = blocked_matmul(reshape(rms_norm(residual_out, next_norm)), next)

This pass puts `torch.ops.specc.decoder_chain` in its place: one parallel region a layer
instead of four, and no hand-over of each matmul's rows to a one-thread kernel and back
(`specc/kernels/decoder_chain.py`; docs/quantization.md, "One call a layer"). Where `next`
is a q/k/v whose columns (plus their biases, Qwen2's) go to Llama's rotary embedding and cache
writes, `decoder_chain_into_cache` does those too (the biases stacked into one buffer), and
where the chain's attention rows are a `row_attention`'s output, `decoder_layer` runs that
attention first: one call a layer. A chain matches only whole: every intermediate used by the
chain alone (`residual_out` may have any users: the next residual, a method's exits), one eps
for both norms. The last layer (whose next norm feeds the head), GELU or extra norms (Gemma 3),
chains split across graph segments and chains in a segment that takes its weights as inputs
(they are packed at compile time, `pack_layer`) keep their calls. Every graph of an engine runs
this pass, so a layer computes the same bits in the `none` engine and in any method's verifying
graph.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from specc.graph.nodes import attribute, calls, graph_modules, stacked_name, value_users
from specc.graph.tidy import tidy
from specc.kernels import blocked_matmul, decoder_chain, row_attention  # noqa: F401  (register torch.ops.specc.*)
from specc.passes.base import GraphPass, PassResult

aten = torch.ops.aten
MATMUL = torch.ops.specc.blocked_matmul.default
DECODER_CHAIN = torch.ops.specc.decoder_chain.default
DECODER_CHAIN_INTO_CACHE = torch.ops.specc.decoder_chain_into_cache.default
DECODER_LAYER = torch.ops.specc.decoder_layer.default
ROW_ATTENTION = torch.ops.specc.row_attention.default
LAST = 9223372036854775807   # a slice's open end as export records it


class FuseDecoderChain(GraphPass):
    """`packed_threads`: the threads each layer's weights are laid out for (`pack_layer`), by default
    torch's now (`specc compile --threads`); an engine run with other threads computes the same
    bits. `store` keeps the packs made, by their weights, so graphs of one program share them."""

    name = "fuse_decoder_chain"

    def __init__(self, packed_threads: int | None = None, store: dict | None = None):
        self.packed_threads = packed_threads or torch.get_num_threads()
        self.store = {} if store is None else store

    def describe(self) -> dict:
        return {"packed_threads": self.packed_threads}

    def run(self, gm: fx.GraphModule) -> PassResult:
        inserted, replaced, added = [], [], []
        for module in graph_modules(gm):
            # one at a time: a chain's residual is the previous chain's output
            fused = 0
            for node in list(module.graph.nodes):
                if node.users and (chain := match_chain(node)) is not None and _reads_its_weights(chain):
                    replaced.append(chain.next_matmul.name)
                    writes = match_cache_write(chain.next_matmul)
                    if writes is not None and writes.biases is not None:
                        writes.bias = self._stacked_bias(module, writes.biases, chain.next_matmul.args[3])
                        if writes.bias is None:
                            writes = None
                    chain.pack, chain.packed_threads = self._pack(module, chain), self.packed_threads
                    added.append(chain.pack)
                    inserted.append((_fuse_into_cache(module, chain, writes) if writes else _fuse(module, chain)).name)
                    fused += 1
            if fused:
                tidy(module)
        if not replaced:
            return PassResult.unchanged(gm)
        return PassResult(gm, True, inserted=inserted, replaced=replaced, added_parameters=added)

    def _pack(self, module: fx.GraphModule, chain: Chain) -> str:
        """The chain's four packed projections as one buffer of `module`, named by its first and last
        (`…o_proj.weight_blocks_then_model_layers_1_…`: a graph that skips a layer chains another)."""
        targets = [node.args[1].target for node in (chain.o, chain.gate_up, chain.down, chain.next_matmul)]
        tensors = [attribute(module, target) for target in targets]
        key = (*(t.data_ptr() for t in tensors), self.packed_threads)
        if key not in self.store:
            self.store[key] = decoder_chain.pack_layer(*tensors, self.packed_threads)
        return _buffer(module, f"{targets[0]}_then_{targets[3].replace('.', '_')}", self.store[key])

    def _stacked_bias(self, module: fx.GraphModule, targets: list[str], features: int) -> str | None:
        """q's, k's and v's biases end to end as one buffer of `module` (`…q_proj_k_proj_v_proj_bias`),
        shared like the packs; None unless they are bfloat16 vectors covering the projection's features."""
        tensors = [attribute(module, target) for target in targets]
        if any(t.dtype != torch.bfloat16 or t.dim() != 1 for t in tensors) or sum(t.numel() for t in tensors) != features:
            return None
        key = ("bias", *(t.data_ptr() for t in tensors))
        if key not in self.store:
            self.store[key] = torch.cat(tensors)
        return _buffer(module, stacked_name(targets), self.store[key])


def _buffer(module: fx.GraphModule, dotted: str, tensor: torch.Tensor) -> str:
    """`tensor` as a buffer of `module` under `dotted` (its owner must exist), unless one is there already."""
    owner_path, _, leaf = dotted.rpartition(".")
    owner = module.get_submodule(owner_path)
    if not hasattr(owner, leaf):
        owner.register_buffer(leaf, tensor)
    return dotted


class Chain:
    """The nodes of one matched chain that its fused call needs."""

    def __init__(self, **nodes):
        self.__dict__.update(nodes)


def match_chain(next_matmul: fx.Node) -> Chain | None:
    """The chain ending at `next_matmul` (a blocked matmul of a normed residual), or None."""
    if not calls(next_matmul, MATMUL):
        return None
    normed_next = _unreshaped(next_matmul.args[0])
    norm_next = _rms_norm(normed_next)
    if norm_next is None or not _only_user(next_matmul.args[0], next_matmul) \
            or not _only_user(normed_next, next_matmul.args[0]):
        return None
    residual_out, next_norm, eps, _ = norm_next
    mlp = _residual_add(residual_out)
    if mlp is None:
        return None
    h, down_out = mlp
    down = _matmul_of(down_out)
    if down is None:
        return None
    gate_up = _gated(_unreshaped(down.args[0]), down.args[0])
    if gate_up is None or not _only_user(down.args[0], down):
        return None
    normed_post = _unreshaped(gate_up.args[0])
    norm_post = _rms_norm(normed_post)
    if norm_post is None or norm_post[0] is not h or norm_post[2] != eps \
            or not _only_user(gate_up.args[0], gate_up) or not _only_user(normed_post, gate_up.args[0]):
        return None
    attention_out = _residual_add(h)
    if attention_out is None:
        return None
    residual, o_out = attention_out
    o = _matmul_of(o_out)
    if o is None or not _users_within(h, {residual_out, norm_post[3]}):
        return None
    hidden = o.args[3]
    if down.args[3] != hidden or gate_up.args[3] % 2:
        return None
    return Chain(attention=o.args[0], residual=residual, o=o, post_norm=norm_post[1], gate_up=gate_up, down=down,
                 next_norm=next_norm, next_matmul=next_matmul, residual_out=residual_out, down_out=down_out,
                 hidden=hidden, eps=eps)


def _reads_its_weights(chain: Chain) -> bool:
    """Whether the chain's four projections read their weights from the graph's own attributes
    (not from a segment's inputs), so that they can be packed into one."""
    return all(node.args[1].op == "get_attr" for node in (chain.o, chain.gate_up, chain.down, chain.next_matmul))


def _fuse(module: fx.GraphModule, chain: Chain) -> fx.Node:
    """The fused call before `residual_out`, in place of it and of the next matmul."""
    graph = module.graph
    before = set(graph.nodes)
    with graph.inserting_before(chain.residual_out):
        fused = graph.call_function(DECODER_CHAIN, tuple(_chain_operands(graph, chain)))
        residual_rows = graph.call_function(operator.getitem, (fused, 0))
        next_rows = graph.call_function(operator.getitem, (fused, 1))
        residual_out = _residual_out(graph, chain, residual_rows)
    _tag(set(graph.nodes) - before, chain)
    chain.residual_out.replace_all_uses_with(residual_out)
    chain.next_matmul.replace_all_uses_with(next_rows)
    return fused


def _fuse_into_cache(module: fx.GraphModule, chain: Chain, writes: CacheWrites) -> fx.Node:
    """The fused call taken on to the cache writes, before `residual_out`: in place of it, of the
    rotated query, and of the two cache writes (erased: they write in place); from the layer's
    row attention on (`decoder_layer`) where the chain's attention rows are its output."""
    graph = module.graph
    before = set(graph.nodes)
    attention = _attention_of(chain.attention)
    with graph.inserting_before(chain.residual_out):
        operands = _chain_operands(graph, chain)
        cache = (writes.cos, writes.sin, writes.positions, writes.k_cache, writes.v_cache, writes.heads)
        if writes.bias is not None:
            cache += (graph.get_attr(writes.bias),)
        if attention is None:
            fused = graph.call_function(DECODER_CHAIN_INTO_CACHE, (*operands, *cache))
        else:
            scale = attention.kwargs.get("scale") or writes.query_view[3] ** -0.5
            fused = graph.call_function(DECODER_LAYER, (*attention.args, scale, *operands[1:], *cache))
        residual_rows = graph.call_function(operator.getitem, (fused, 0))
        query_rows = graph.call_function(operator.getitem, (fused, 1))
        residual_out = _residual_out(graph, chain, residual_rows)
    with graph.inserting_before(writes.query):
        heads = graph.call_function(aten.view.default, (query_rows, writes.query_view))
        query = graph.call_function(aten.transpose.int, (heads, 1, 2))
    _tag(set(graph.nodes) - before, chain)
    chain.residual_out.replace_all_uses_with(residual_out)
    writes.query.replace_all_uses_with(query)
    for write, cache in ((writes.k_write, writes.k_cache), (writes.v_write, writes.v_cache)):
        write.replace_all_uses_with(cache)
        graph.erase_node(write)
    return fused


def _chain_operands(graph: fx.Graph, chain: Chain) -> list:
    """The operands the three operators share (the attention rows first), read at the insertion point."""
    residual_rows = graph.call_function(aten.reshape.default, (chain.residual, [-1, chain.hidden]))
    norms = [_available(graph, node) for node in (chain.post_norm, chain.next_norm)]
    bits = [chain.o.args[2], chain.gate_up.args[2], chain.down.args[2], chain.next_matmul.args[2]]
    sizes = [chain.gate_up.args[3] // 2, chain.next_matmul.args[3], chain.packed_threads]
    return [chain.attention, residual_rows, graph.get_attr(chain.pack), *norms, *bits, *sizes, chain.eps]


def _residual_out(graph: fx.Graph, chain: Chain, rows: fx.Node) -> fx.Node:
    """`rows` `[n, hidden]` in `residual_out`'s shape, sized by the residual, not by the chain's own
    nodes (which are then left unused)."""
    leading = [graph.call_function(aten.sym_size.int, (chain.residual, dim))
               for dim in range(len(chain.down_out.args[1]) - 1)]
    return graph.call_function(aten.reshape.default, (rows, [*leading, chain.hidden]))


def _tag(nodes, chain: Chain) -> None:
    for node in nodes:
        node.meta["nn_module_stack"] = chain.residual_out.meta.get("nn_module_stack", [])


def _attention_of(rows: fx.Node) -> fx.Node | None:
    """The row attention whose output `rows` (`[n, heads * head_dim]`) is, through its reshapes and
    one transpose of heads and rows, each step used there alone; else None."""
    node, transposes = rows, 0
    while calls(node, aten.reshape.default, aten.view.default, aten.transpose.int):
        if calls(node, aten.transpose.int):
            if tuple(node.args[1:]) != (1, 2):
                return None
            transposes += 1
        node = node.args[0]
        if len(value_users(node)) != 1:
            return None
    return node if calls(node, ROW_ATTENTION) and transposes == 1 and len(node.args) == 4 else None


def _available(graph: fx.Graph, node: fx.Node) -> fx.Node:
    """`node` usable at the insertion point: a weight read (`get_attr`) is read again there, since
    the graph reads each weight just before its use."""
    return graph.get_attr(node.target) if node.op == "get_attr" else node


def _unreshaped(node):
    return node.args[0] if calls(node, aten.reshape.default, aten.view.default) else node


def _only_user(node: fx.Node, user: fx.Node) -> bool:
    return isinstance(node, fx.Node) and value_users(node) == {user}


def _users_within(node: fx.Node, allowed: set) -> bool:
    return value_users(node) <= allowed


def _matmul_of(reshaped) -> fx.Node | None:
    """The blocked matmul whose `[rows, out]` result `reshaped` reshapes back, used there alone."""
    matmul = _unreshaped(reshaped)
    if matmul is reshaped or not calls(matmul, MATMUL) or not _only_user(matmul, reshaped) \
            or len(value_users(reshaped)) != 1:
        return None
    return matmul


def _residual_add(node) -> tuple[fx.Node, fx.Node] | None:
    """(residual, addend) of `node = residual + reshape(matmul)`, else None."""
    if not calls(node, aten.add.Tensor) or len(node.args) != 2 or node.kwargs:
        return None
    residual, addend = node.args
    return (residual, addend) if isinstance(residual, fx.Node) and isinstance(addend, fx.Node) else None


def _to_dtype(node, dtype: torch.dtype):
    """x of `x.to(dtype)`, else None."""
    if calls(node, aten.to.dtype) and len(node.args) >= 2 and node.args[1] == dtype:
        return node.args[0]
    if calls(node, aten._to_copy.default) and node.kwargs.get("dtype") == dtype and len(node.args) == 1:
        return node.args[0]
    return None


def _rms_norm(node) -> tuple[fx.Node, fx.Node, float, fx.Node] | None:
    """(x, weight, eps, x32) of Llama's eager RMSNorm ending at `node`, its inner nodes used within it
    alone: weight * (x32 * rsqrt(mean(x32 ** 2, -1, keepdim) + eps)).to(bfloat16), x32 = x.to(float32)."""
    if not calls(node, aten.mul.Tensor) or len(node.args) != 2:
        return None
    weight, scaled = node.args
    if _to_dtype(scaled, torch.bfloat16) is None:
        weight, scaled = scaled, weight
    product = _to_dtype(scaled, torch.bfloat16)
    if not isinstance(weight, fx.Node) or weight.op not in ("get_attr", "placeholder") \
            or not calls(product, aten.mul.Tensor) or not _only_user(scaled, node) or not _only_user(product, scaled):
        return None
    x32, root = product.args
    if not calls(root, aten.rsqrt.default) or not _only_user(root, product):
        return None
    shifted = root.args[0]
    if not calls(shifted, aten.add.Tensor) or not isinstance(shifted.args[1], float) or not _only_user(shifted, root):
        return None
    mean = shifted.args[0]
    if not calls(mean, aten.mean.dim) or list(mean.args[1]) != [-1] or not (len(mean.args) > 2 and mean.args[2]) \
            or not _only_user(mean, shifted):
        return None
    square = mean.args[0]
    if not calls(square, aten.pow.Tensor_Scalar) or square.args != (x32, 2) or not _only_user(square, mean):
        return None
    x = _to_dtype(x32, torch.float32)
    if x is None or value_users(x32) != {square, product}:
        return None
    return x, weight, shifted.args[1], x32


def _gated(act, reshaped_act) -> fx.Node | None:
    """The gate/up matmul of `act = silu(reshape(gu[:, :I])) * reshape(gu[:, I:])`, every step used
    once, else None."""
    if not calls(act, aten.mul.Tensor) or len(act.args) != 2 or not _only_user(act, reshaped_act):
        return None
    activated, up = act.args
    if not calls(activated, aten.silu.default) or not _only_user(activated, act) or not _only_user(up, act):
        return None
    gate = activated.args[0]
    if not _only_user(gate, activated):
        return None
    gate_slice, up_slice = _unreshaped(gate), _unreshaped(up)
    if not (calls(gate_slice, aten.slice.Tensor) and calls(up_slice, aten.slice.Tensor)):
        return None
    gate_up = gate_slice.args[0]
    if not calls(gate_up, MATMUL) or up_slice.args[0] is not gate_up or value_users(gate_up) != {gate_slice, up_slice}:
        return None
    half = gate_up.args[3] // 2
    if tuple(gate_slice.args[1:]) != (1, 0, half) or tuple(up_slice.args[1:3]) != (1, half) \
            or up_slice.args[3] < 2 * half:
        return None
    return gate_up


class CacheWrites:
    """What a chain's next projection feeds in Llama's attention: the rotated query, the two cache
    writes, and their operands."""

    def __init__(self, **nodes):
        self.__dict__.update(nodes)


def match_cache_write(projection: fx.Node) -> CacheWrites | None:
    """The rotary embedding and cache writes a q/k/v `projection` feeds, else None: q, k, v its
    column slices in that order, each plus a bias (all three or none: `biases`, their targets; `bias`,
    the stacked buffer, is the pass's to set) and viewed as heads (`[1, s, -1, head_dim]`, transposed),
    q and k rotated by one cos and sin, k and v written into caches at one set of
    positions, every step used there alone."""
    slices = sorted(value_users(projection), key=lambda n: n.args[2] if calls(n, aten.slice.Tensor) else -1)
    if len(slices) != 3 or not all(calls(n, aten.slice.Tensor) and n.args[1] == 1 for n in slices):
        return None
    bounds = [(n.args[2], n.args[3]) for n in slices]
    if bounds[0][0] != 0 or bounds[0][1] != bounds[1][0] or bounds[1][1] != bounds[2][0] \
            or bounds[2][1] not in (projection.args[3], LAST):
        return None
    heads = [_as_heads(n) for n in slices]
    if any(h is None for h in heads):
        return None
    (q, q_view, q_bias), (k, _, k_bias), (v, _, v_bias) = heads
    biases = [q_bias, k_bias, v_bias]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    head_dim = q_view[3]
    q_rope, k_rope = _rotated(q, head_dim), _rotated(k, head_dim)
    if q_rope is None or k_rope is None or q_rope[1:] != k_rope[1:]:
        return None
    k_write, v_write = _cache_write(k_rope[0]), _cache_write(v)
    if k_write is None or v_write is None or k_write.args[1][2] is not v_write.args[1][2]:
        return None
    width = bounds[0][1]
    if width % head_dim or (bounds[1][1] - bounds[1][0]) % head_dim:
        return None
    return CacheWrites(query=q_rope[0], query_view=q_view, cos=q_rope[1], sin=q_rope[2],
                       positions=k_write.args[1][2], k_cache=k_write.args[0], v_cache=v_write.args[0],
                       k_write=k_write, v_write=v_write, heads=width // head_dim,
                       biases=[b.target for b in biases] if q_bias is not None else None, bias=None)


def _as_heads(columns: fx.Node) -> tuple[fx.Node, list, fx.Node | None] | None:
    """(x, the view's shape, the bias read or None) of `x = transpose(view(reshape(columns, ...) [+ bias],
    [1, s, -1, head_dim]), 1, 2)`, the bias a weight of the columns' width."""
    reshaped = _single_user(columns)
    viewed = _single_user(reshaped) if calls(reshaped, aten.reshape.default, aten.view.default) else None
    bias = None
    if calls(viewed, aten.add.Tensor) and viewed.args[0] is reshaped and isinstance(viewed.args[1], fx.Node) \
            and viewed.args[1].op == "get_attr":
        bias, viewed = viewed.args[1], _single_user(viewed)
    if not calls(viewed, aten.view.default, aten.reshape.default):
        return None
    shape = viewed.args[1]
    transposed = _single_user(viewed)
    if len(shape) != 4 or shape[0] != 1 or shape[2] != -1 or not isinstance(shape[3], int) \
            or not calls(transposed, aten.transpose.int) or tuple(transposed.args[1:]) != (1, 2):
        return None
    return transposed, list(shape), bias


def _single_user(node) -> fx.Node | None:
    users = value_users(node) if isinstance(node, fx.Node) else set()
    return next(iter(users)) if len(users) == 1 else None


def _rotated(x: fx.Node, head_dim: int) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """(the result, cos, sin) of Llama's `x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)`,
    its steps used there alone."""
    half = head_dim // 2
    users = value_users(x)
    if len(users) != 3:
        return None
    by_kind = {}
    for user in users:
        if calls(user, aten.mul.Tensor) and user.args[0] is x:
            by_kind["scaled"] = user
        elif calls(user, aten.slice.Tensor) and tuple(user.args[1:]) == (3, 0, half):
            by_kind["first"] = user
        elif calls(user, aten.slice.Tensor) and tuple(user.args[1:3]) == (3, half) and user.args[3] in (head_dim, LAST):
            by_kind["second"] = user
    if len(by_kind) != 3:
        return None
    negated = _single_user(by_kind["second"])
    turned = _single_user(negated) if calls(negated, aten.neg.default) else None
    if not calls(turned, aten.cat.default) or list(turned.args[0]) != [negated, by_kind["first"]] \
            or turned.args[1] not in (-1, 3) or _single_user(by_kind["first"]) is not turned:
        return None
    swung = _single_user(turned)
    total = _single_user(by_kind["scaled"])
    if not calls(swung, aten.mul.Tensor) or swung.args[0] is not turned or not calls(total, aten.add.Tensor) \
            or set(total.args) != {by_kind["scaled"], swung} or total.args[0] is not by_kind["scaled"]:
        return None
    cos, sin = (_unsqueezed(node.args[1]) for node in (by_kind["scaled"], swung))
    if cos is None or sin is None:
        return None
    return total, cos, sin


def _unsqueezed(node) -> fx.Node | None:
    """t of `t.unsqueeze(1)`."""
    return node.args[0] if calls(node, aten.unsqueeze.default) and node.args[1] == 1 else None


def _cache_write(value: fx.Node) -> fx.Node | None:
    """The `cache.index_put_([None, None, positions], value)` of `value`, read by one slice alone."""
    write = _single_user(value)
    if not calls(write, aten.index_put_.default) or write.args[2] is not value or len(write.args) > 3:
        return None
    indices = write.args[1]
    if len(indices) != 3 or indices[0] is not None or indices[1] is not None or not isinstance(indices[2], fx.Node) \
            or write.args[0].op != "placeholder":
        return None
    reader = _single_user(write)
    return write if calls(reader, aten.slice.Tensor) and reader.args[1] == 2 else None
