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
UNQUANTIZED_BYTES = 2        # per weight: quantized engines are bfloat16
TARGET_REPORT = "quantization"        # the manifest's key for the verifying graphs' scheme
DRAFT_REPORT = "draft_quantization"   # ... and for the draft graphs', where they have their own


def quantized_weights(gm: fx.GraphModule) -> dict[tuple[int, int], tuple[str, int, int]]:
    """Every packed weight the graph (segments included) reads, by (the tensor's data_ptr, the
    weight's place in it: a decoder chain's layer pack holds four): (kind, its bytes with its
    scales, the bytes it had unquantized in the scales' dtype)."""
    tensors = graph_attributes(gm)
    found = {}
    for (pointer, part), (bits, features, inputs) in blocked_weights(gm).items():
        packed_bytes = features // blocked.TILE * blocked.tile_bytes(inputs, bits)
        found[(pointer, part)] = f"q{bits}", packed_bytes, features * inputs * UNQUANTIZED_BYTES
    for name, qweight in tensors.items():
        if not name.endswith("_qweight"):
            continue
        stem = name[: -len("_qweight")]
        scales = next(tensors[stem + suffix] for suffix in PACKED_SUFFIXES[1:] if stem + suffix in tensors)
        rows, columns = qweight.shape
        inputs = columns if qweight.dtype == torch.int8 else 2 * columns
        kind = "int8" if qweight.dtype == torch.int8 else f"int4-g{inputs // scales.shape[0]}"
        features = rows * inputs
        found[(qweight.data_ptr(), 0)] = (kind, _bytes(qweight) + _bytes(scales), features * scales.element_size())
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


def blocked_weights(gm: fx.GraphModule, inputs: list | None = None) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Every weight a `specc.blocked_matmul`, decoder chain or stack call of `gm` (segments included)
    reads, by (its tensor's data_ptr, its place in it): (bits, output features, inputs). The call
    says the bits (a tile's bytes alone can fit both 4 and 8)."""
    values = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), inputs or []))
    found = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = attribute(gm, node.target)
        elif node.op == "call_module":
            found.update(blocked_weights(gm.get_submodule(node.target), [values.get(arg) for arg in node.args]))
        elif node.target is torch.ops.specc.blocked_matmul.default:
            packed, bits = values.get(node.args[1]), node.args[2]
            if isinstance(packed, torch.Tensor):
                found[(packed.data_ptr(), 0)] = bits, node.args[3], blocked.inputs_of(packed, bits)
        elif node.target in decoder_chain.OPERATORS:
            operands = decoder_chain.named_operands(node.target, node.args)
            bits = tuple(operands[f"{name}_bits"] for name in ("o", "gate_up", "down", "next"))
            found.update(_layer_weights(values.get(operands["weights"]), values.get(operands["post_norm"]), bits,
                                        operands))
        elif node.target is torch.ops.specc.decoder_stack.default:
            operands = decoder_chain.named_operands(node.target, node.args)
            for i, (weights, post_norm) in enumerate(zip(operands["weights"], operands["post_norms"])):
                found.update(_layer_weights(values.get(weights), values.get(post_norm),
                                            tuple(operands["bits"][4 * i:4 * i + 4]), operands))
    return found


def _layer_weights(weights, post_norm, bits: tuple, operands: dict) -> dict:
    """A decoder layer pack's four projections by (its data_ptr, their place in it), as blocked_weights gives them."""
    if not (isinstance(weights, torch.Tensor) and isinstance(post_norm, torch.Tensor)):
        return {}
    projections = decoder_chain.layer_projections(post_norm.shape[0], operands["intermediate"],
                                                  operands["next_features"], bits)
    return {(weights.data_ptr(), part): p for part, p in enumerate(projections)}


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
