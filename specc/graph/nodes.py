"""Read what a node is from its metadata: which module, which decoder layer."""

from __future__ import annotations

import re

import torch
import torch.fx as fx

SDPA = torch.ops.aten.scaled_dot_product_attention.default
ATTENTION_WINDOW = "specc_attention_window"   # an attention call's meta: its layer's sliding window (capture)
WINDOWED_MASK = "specc_windowed_mask"         # a mask node's meta: the window it hides keys beyond
# An attention call's meta: the query rows up to which it computes each row alike (padded to them, or row by row).
PADDED_ROWS = "specc_padded_rows"
ROW_ATTENTION = "specc.row_attention.default"   # the row-by-row attention kernel, by name (graph/ imports no kernels)
# Ops that read their first argument, a table, a row at a time: a step does not stream that table.
ROW_LOOKUPS = (torch.ops.aten.embedding.default,)
FROZEN_COPIES = "specc_frozen_copies"         # a GraphModule's meta: attributes holding copies of frozen weights
_LAYER_PATH = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def module_path(node: fx.Node) -> str:
    """The innermost module that produced `node` ('' for top-level glue)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _type = list(stack.values())[-1]
    return normalize_path(path)


def normalize_path(path: str) -> str:
    # Dynamo-style paths look like "L['self'].model.layers[0].self_attn".
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(\d+)\]", r".\1", path)


def layer_index(node: fx.Node) -> int | None:
    match = _LAYER_PATH.search(module_path(node))
    return int(match.group(1)) if match else None


def attention_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The scaled_dot_product_attention calls, in graph order."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target == SDPA]


def graph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """`gm` and the GraphModules it calls (layer segments)."""
    called = [gm.get_submodule(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    return [gm, *(m for m in called if isinstance(m, fx.GraphModule))]


def calls_submodules(gm: fx.GraphModule, prefixes: tuple[str, ...]) -> bool:
    """Whether the graph already calls submodules named with one of `prefixes`
    (a segmenting pass has run on it)."""
    return any(n.op == "call_module" and str(n.target).startswith(prefixes) for n in gm.graph.nodes)


def calls(node, *targets) -> bool:
    """Whether `node` is a call of one of `targets`."""
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def value_users(node: fx.Node) -> set[fx.Node]:
    """`node`'s users but the reads of its sizes (`quantize_linear_weights` reshapes with them)."""
    return {user for user in node.users if not calls(user, torch.ops.aten.sym_size.int)}


def placeholder(graph: fx.Graph, name: str) -> fx.Node | None:
    return next((n for n in graph.nodes if n.op == "placeholder" and n.target == name), None)


def add_placeholder(graph: fx.Graph, name: str, example: torch.Tensor | None = None) -> fx.Node:
    """Append a new graph input after the existing ones."""
    existing = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = existing[-1] if existing else None
    if anchor is None:
        with graph.inserting_before(next(iter(graph.nodes))):
            node = graph.placeholder(name)
    else:
        with graph.inserting_after(anchor):
            node = graph.placeholder(name)
    if example is not None:
        node.meta["val"] = example
    return node


def attribute(root: torch.nn.Module, target: str) -> torch.Tensor:
    """The parameter or buffer a `get_attr` target names (a dotted path from `root`)."""
    value = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def stacked_name(targets: list[str]) -> str:
    """One name for sibling tensors stacked end to end, on their common owner, ending in their own
    leaf: `…mlp.gate_proj.weight` + `…mlp.up_proj.weight` -> `…mlp.gate_proj_up_proj_weight`
    (`…self_attn.q_proj.bias`, … -> `…self_attn.q_proj_k_proj_v_proj_bias`); targets without an owner
    are joined whole."""
    if not all("." in target for target in targets):
        return "_".join(target.replace(".", "_") for target in targets)
    owners = [target.rpartition(".")[0] for target in targets]
    leaf = targets[0].rpartition(".")[2]
    parent = owners[0].rpartition(".")[0]
    if any(owner.rpartition(".")[0] != parent for owner in owners):
        parent = ""
    leaves = "_".join(owner.rpartition(".")[2] if parent else owner.replace(".", "_") for owner in owners)
    return f"{parent}.{leaves}_{leaf}" if parent else f"{leaves}_{leaf}"


def output_node(graph: fx.Graph) -> fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def rows_computed_alike(gm: fx.GraphModule) -> int | None:
    """The row count up to which `gm` computes every row alike whatever the call's row count,
    or None. A graph qualifies when every matmul with weights is a quantized kernel (those
    compute a row the same way at any row count; no `aten.linear` is left) and every
    attention call pads its query rows itself (`passes/pad_attention_rows.py`) or computes
    them one by one (`passes/use_row_attention.py`); segmented graphs do not (their segments
    are lowered apart)."""
    if not weights_all_quantized(gm):
        return None
    calls = [*attention_nodes(gm.graph), *(n for n in gm.graph.nodes if str(n.target) == ROW_ATTENTION)]
    padded = {n.meta.get(PADDED_ROWS) for n in calls}
    return padded.pop() if len(padded) == 1 and None not in padded else None


def weights_all_quantized(gm: fx.GraphModule) -> bool:
    """No `aten.linear` left (bfloat16 GEMMs round a row by the call's row count) and no segments."""
    return not any(n.op == "call_module" or is_linear(n) for n in gm.graph.nodes)


def is_linear(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target == torch.ops.aten.linear.default
