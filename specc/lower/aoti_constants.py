"""AOTInductor packages that hold no weights of their own: they read the graph's tensors in place.

Built the default way, a package embeds every constant in its shared library, and loading
copies them into memory of its own. An engine's graph has two packages (narrow and wide,
`aoti.py`), so a process held the weights three times (the graph's own and one copy per
package) and the engine's files held them three times too. Where every constant of a
package is one of the graph's own tensors, as in a graph whose weights are all quantized
(freezing has no linear layer to prepack there), the package is built without them
(`aot_inductor.package_constants_in_so=False`) and says so in its metadata; loading hands
it the graph's tensors (`load_constants(..., user_managed=True)`), which both packages then
read where they are. A package that turns out to hold a constant of Inductor's own making
(a folded or prepacked weight) is built again the default way.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx as fx

from specc.graph.nodes import weights_all_quantized
from specc.graph.serialize import graph_attributes
from specc.lower import c_shims

CONSTANTS_KEY = "specc_constants"   # package metadata: where the package's constants come from
FROM_GRAPH = "graph"                # the graph's own tensors, handed over at load time

PACKAGED_WITHOUT_CONSTANTS = {"aot_inductor.package_constants_in_so": False}

# PyTorch's own quantized matmuls (`--quantize int8|int4-g*`): freezing folds their scales into
# constants of its own, so trying those graphs without their weights would only package them twice.
FOLDED_BY_FREEZING = (torch.ops.aten._weight_int8pack_mm.default, torch.ops.aten._weight_int4pack_mm_for_cpu.default)


def may_read_graph_constants(module: torch.nn.Module, device: torch.device) -> bool:
    """Whether to try packaging `module` without its weights: a CPU graph whose every weight
    is quantized for specc's kernels, which take the stored tensors as they are."""
    return (device.type == "cpu" and isinstance(module, fx.GraphModule) and weights_all_quantized(module)
            and not any(node.op == "call_function" and node.target in FOLDED_BY_FREEZING for node in module.graph.nodes))


def reads_only_graph_constants(path: Path, module: fx.GraphModule, device: torch.device) -> bool:
    """Whether every constant the package at `path` asks for is one of `module`'s tensors."""
    c_shims.expose(module, device)
    package = torch._inductor.aoti_load_package(str(path))
    return set(package.get_constant_fqns()) <= set(graph_attributes(module))


def reads_graph_constants(package) -> bool:
    return package.get_metadata().get(CONSTANTS_KEY) == FROM_GRAPH


def hand_over_constants(package, module: fx.GraphModule) -> None:
    """Point `package`'s constants at `module`'s tensors; the package keeps a reference to them,
    since it reads their memory and does not own it."""
    constants = graph_attributes(module)
    handed = {name: constants[name] for name in package.get_constant_fqns()}
    package.load_constants(handed, check_full_update=True, user_managed=True)
    package.graph_constants = handed
