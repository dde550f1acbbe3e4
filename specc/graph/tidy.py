"""Keep a rewritten GraphModule valid: dead code gone, attributes pruned, linted."""

from __future__ import annotations

import torch
import torch.fx as fx

_ASSERTION_TARGETS = {
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def remove_assertions(gm: fx.GraphModule) -> int:
    """Drop export's shape/dtype assertions: they pin the capture-time inputs."""
    removed = 0
    for node in list(gm.graph.nodes):
        is_assert = node.op == "call_function" and node.target in _ASSERTION_TARGETS
        is_guard = node.op == "call_module" and str(node.target).startswith("_guards")
        if (is_assert or is_guard) and not node.users:
            gm.graph.erase_node(node)
            removed += 1
    return removed


def tidy(gm: fx.GraphModule) -> fx.GraphModule:
    """Dead-code-eliminate, prune unused attributes, lint and recompile."""
    gm.graph.eliminate_dead_code()
    prune_unused_attributes(gm)
    gm.graph.lint()
    gm.recompile()
    return gm


def prune_unused_attributes(gm: fx.GraphModule) -> None:
    used = {n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name not in used:
            _delete_attr(gm, name)
    gm.delete_all_unused_submodules()


def _delete_attr(root: torch.nn.Module, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    owner = root
    for part in parents:
        owner = getattr(owner, part)
    delattr(owner, leaf)
