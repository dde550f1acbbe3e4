"""The manifest's `quantization` entries (the verifying graphs'; the draft graphs' as
`draft_quantization` where `--quantize-draft` or a draft model gives them their own): the
scheme, what it packed, and what it costs."""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.graph.nodes import attribute
from specc.graph.serialize import graph_attributes
from specc.kernels import blocked_matmul as blocked
from specc.kernels import decoder_chain
from specc.quantize.quality import quantization_quality
from specc.quantize.schemes import Scheme

PACKED_SUFFIXES = ("_qweight", "_scales", "_scales_and_zeros")   # `quantize_linear_weights`' buffer names
BLOCKED_SUFFIX = "_blocks"   # q4/q6/q8: scales, mins and values in one tensor
UNQUANTIZED_BYTES = 2        # per weight: quantized engines are bfloat16
TARGET_REPORT = "quantization"        # the manifest's key for the verifying graphs' scheme
DRAFT_REPORT = "draft_quantization"   # ... and for the draft graphs', where they have their own


def quantized_weights(gm: fx.GraphModule) -> dict[int, tuple[str, int, int]]:
    """Every packed weight the graph (segments included) reads: data_ptr -> (kind, its bytes
    with its scales, the bytes it had unquantized in the scales' dtype)."""
    tensors = graph_attributes(gm)
    found = {}
    bits = blocked_bits(gm)
    for name, packed in tensors.items():
        if name.endswith(BLOCKED_SUFFIX):
            found[packed.data_ptr()] = _blocked_weight(packed, bits[packed.data_ptr()])
    for name, qweight in tensors.items():
        if not name.endswith("_qweight"):
            continue
        stem = name[: -len("_qweight")]
        scales = next(tensors[stem + suffix] for suffix in PACKED_SUFFIXES[1:] if stem + suffix in tensors)
        rows, columns = qweight.shape
        inputs = columns if qweight.dtype == torch.int8 else 2 * columns
        kind = "int8" if qweight.dtype == torch.int8 else f"int4-g{inputs // scales.shape[0]}"
        features = rows * inputs
        found[qweight.data_ptr()] = (kind, _bytes(qweight) + _bytes(scales), features * scales.element_size())
    return found


def quantization_report(program, scheme: Scheme, graphs: list[str], model: torch.nn.Module, tokenizer) -> dict:
    """What `scheme` packed in `program`'s `graphs` (of `model`), and what it costs `model`."""
    weights = {}
    for name in graphs:
        weights.update(quantized_weights(program.graphs[name].module))
    kinds = sorted({kind for kind, _, _ in weights.values()})
    return {
        **scheme.to_json(),
        "linear_weights": {kind: sum(1 for k, _, _ in weights.values() if k == kind) for kind in kinds},
        "bytes": {"quantized": sum(b for _, b, _ in weights.values()),
                  "unquantized": sum(b for _, _, b in weights.values())},
        "quality": quantization_quality(model, tokenizer, scheme),
    }


def blocked_bits(gm: fx.GraphModule, inputs: list | None = None) -> dict[int, int]:
    """The bits of every weight a `specc.blocked_matmul` or decoder chain call of `gm`
    (segments included) reads, by the weight's data_ptr: the call says them (a tile's bytes alone
    can fit both 4 and 8)."""
    values = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), inputs or []))
    found = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = attribute(gm, node.target)
        elif node.op == "call_module":
            found.update(blocked_bits(gm.get_submodule(node.target), [values.get(arg) for arg in node.args]))
        else:
            for weight, bits in _packed_weights(node):
                if isinstance(values.get(node.args[weight]), torch.Tensor):
                    found[values[node.args[weight]].data_ptr()] = node.args[bits]
    return found


def _packed_weights(node: fx.Node) -> tuple[tuple[int, int], ...]:
    """(argument position of each blocked weight `node` reads, position of its bits)."""
    if node.target is torch.ops.specc.blocked_matmul.default:
        return ((1, 2),)
    if node.target in (torch.ops.specc.decoder_chain.default, torch.ops.specc.decoder_chain_into_cache.default):
        return decoder_chain.PACKED_WEIGHTS
    if node.target is torch.ops.specc.decoder_layer.default:
        return decoder_chain.LAYER_PACKED_WEIGHTS
    return ()


def _blocked_weight(packed: torch.Tensor, bits: int) -> tuple[str, int, int]:
    inputs = blocked.inputs_of(packed, bits)
    return f"q{bits}", _bytes(packed), packed.shape[0] * blocked.TILE * inputs * UNQUANTIZED_BYTES


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def describe_reports(manifest: dict) -> list[str]:
    """A line per quantization report of an engine's manifest (or compile report): the
    verifying graphs', then the draft graphs' where they have their own."""
    return [prefix + describe_quantization(manifest[key])
            for key, prefix in ((TARGET_REPORT, ""), (DRAFT_REPORT, "draft graphs: ")) if key in manifest]


def describe_quantization(quantization: dict) -> str:
    """One line on what quantization packed, saved and cost (the manifest's `quantization`)."""
    sizes, quality = quantization["bytes"], quantization["quality"]
    counts = ", ".join(f"{count} {kind}" for kind, count in quantization["linear_weights"].items())
    return (f"quantized {quantization['scheme']} ({quantization['granularity']}): linear weights {counts}, "
            f"{sizes['unquantized'] / 1e6:.1f} MB -> {sizes['quantized'] / 1e6:.1f} MB; top-1 agreement with "
            f"the unquantized model {quality['top1_agreement']:.1%} over {quality['tokens']} held-out tokens, "
            f"perplexity {quality['perplexity']['reference']} -> {quality['perplexity']['quantized']}")
