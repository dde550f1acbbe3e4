"""specc's CPU operators called directly from AOTInductor packages (C shims).

A package calls a custom operator through its proxy executor unless Inductor is told
of a C function for it: the executor boxes every argument and dispatches by name on
each call, which cost more than the call of a small quantized matmul itself, and a q4
decode step makes about four such calls a layer. specc's CPU library defines
`aoti_torch_cpu_<op>` for `blocked_matmul`, `row_attention` and the decoder chains and stacks
(`specc/kernels/cpu/torch_ops.cpp`); packages for the CPU whose graph calls them are
built to call those functions, and their shared object then names them undefined: the
library must be loaded into the global symbol scope before such a package loads
(`expose`), which loading any CPU package that calls a specc operator does.
Measurements: docs/quantization.md ("Calls").
"""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.kernels import blocked_matmul, decoder_chain, row_attention  # noqa: F401  (define torch.ops.specc.*)
from specc.kernels.registry import kernels_in_graph

# The decoder chains' operands from their layer's pack to eps, and on to the cache writes.
_LAYER = ("AtenTensorHandle weights, AtenTensorHandle post_norm, AtenTensorHandle next_norm, int64_t o_bits, "
          "int64_t gate_up_bits, int64_t down_bits, int64_t next_bits, int64_t intermediate, int64_t next_features, "
          "int64_t packed_threads, double eps")
_CACHE_WRITE = ("AtenTensorHandle cos, AtenTensorHandle sin, AtenTensorHandle cache_positions, "
                "AtenTensorHandle k_cache, AtenTensorHandle v_cache, int64_t heads, AtenTensorHandle* next_bias")

# Inductor writes `extern` declarations of these into the package and calls them by name:
# aoti_torch_<device>_<operator>, tensors as handles, `float?` and `Tensor?` as a pointer (null for None),
# a list as a pointer to its first element and its length.
DECLARATIONS = {
    "blocked_matmul": "AOTITorchError aoti_torch_cpu_blocked_matmul(AtenTensorHandle rows, AtenTensorHandle packed, "
                      "int64_t bits, int64_t out_features, AtenTensorHandle* ret0)",
    "row_attention": "AOTITorchError aoti_torch_cpu_row_attention(AtenTensorHandle query, AtenTensorHandle key, "
                     "AtenTensorHandle value, AtenTensorHandle mask, double* scale, AtenTensorHandle* ret0)",
    "decoder_chain": "AOTITorchError aoti_torch_cpu_decoder_chain(AtenTensorHandle attention, AtenTensorHandle residual, "
                     f"{_LAYER}, AtenTensorHandle* ret0, AtenTensorHandle* ret1)",
    "decoder_chain_into_cache": "AOTITorchError aoti_torch_cpu_decoder_chain_into_cache(AtenTensorHandle attention, "
                                f"AtenTensorHandle residual, {_LAYER}, {_CACHE_WRITE}, "
                                "AtenTensorHandle* ret0, AtenTensorHandle* ret1)",
    "decoder_layer": "AOTITorchError aoti_torch_cpu_decoder_layer(AtenTensorHandle query, AtenTensorHandle key, "
                     "AtenTensorHandle value, AtenTensorHandle mask, double scale, AtenTensorHandle residual, "
                     f"{_LAYER}, {_CACHE_WRITE}, AtenTensorHandle* ret0, AtenTensorHandle* ret1)",
    "decoder_stack": "AOTITorchError aoti_torch_cpu_decoder_stack(AtenTensorHandle query, AtenTensorHandle mask, "
                     "double scale, AtenTensorHandle residual, const AtenTensorHandle* weights, int64_t weights_count, "
                     "const AtenTensorHandle* post_norms, int64_t post_norms_count, "
                     "const AtenTensorHandle* next_norms, int64_t next_norms_count, const int64_t* bits, "
                     "int64_t bits_count, int64_t intermediate, int64_t next_features, int64_t packed_threads, "
                     "double eps, AtenTensorHandle cos, AtenTensorHandle sin, AtenTensorHandle cache_positions, "
                     "int64_t kv_length, const AtenTensorHandle* k_caches, int64_t k_caches_count, "
                     "const AtenTensorHandle* v_caches, int64_t v_caches_count, int64_t heads, "
                     "const AtenTensorHandle* next_biases, int64_t next_biases_count, AtenTensorHandle* ret0, "
                     "AtenTensorHandle* ret1)",
}


def shimmed_operators(module: torch.nn.Module) -> list[str]:
    """The specc operators with a C shim that `module`'s graph (or a graph it calls) calls."""
    if not isinstance(module, fx.GraphModule):
        return []
    called = set(kernels_in_graph(module))
    return [name for name in DECLARATIONS if name in called]


def shim_config(module: torch.nn.Module, device: torch.device) -> dict:
    """Inductor settings that make a CPU package call specc's operators through their shims."""
    names = shimmed_operators(module) if device.type == "cpu" else []
    if not names:
        return {}
    return {"aot_inductor.custom_ops_to_c_shims": {_overload(name): [DECLARATIONS[name]] for name in names}}


def expose(module: torch.nn.Module, device: torch.device) -> None:
    """Before a package of `module` loads: specc's CPU library in the global symbol scope,
    where the package's dynamic loader finds the shims it calls (no-op when it calls none)."""
    if device.type == "cpu" and shimmed_operators(module):
        from specc.kernels.cpu.build import NATIVE, load_library

        load_library(NATIVE)   # opened global


def _overload(name: str):
    return getattr(torch.ops.specc, name).default
