"""A package built without its weights reads the graph's tensors where they are, and one that
needs a constant of Inductor's own making is not built that way."""

from __future__ import annotations

import pytest
import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.lower import c_shims
from specc.lower.aoti_constants import (CONSTANTS_KEY, FROM_GRAPH, PACKAGED_WITHOUT_CONSTANTS, hand_over_constants,
                                        may_read_graph_constants, reads_graph_constants,
                                        reads_only_graph_constants)
from tests.lower.quantized_layer import QuantizedLayer, example_inputs


class FoldedWeight(torch.nn.Module):
    """Freezing folds `weight * 2` into a constant the graph does not hold."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return torch.relu(x @ (self.weight * 2))


class Int8Projection(torch.nn.Module):
    """PyTorch's int8 weight-only matmul, whose scales freezing folds into constants of its own."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randint(-127, 127, (16, 32), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(16).bfloat16())

    def forward(self, x):
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)


def _package_without_weights(module: torch.fx.GraphModule, example, path) -> str:
    config = {**c_shims.shim_config(module, torch.device("cpu")), **PACKAGED_WITHOUT_CONSTANTS, "freezing": True,
              "aot_inductor.metadata": {CONSTANTS_KEY: FROM_GRAPH}}
    with torch._inductor.config.patch(config), torch.no_grad():
        return torch._inductor.aoti_compile_and_package(torch.export.export(module, example), package_path=str(path))


def test_a_package_built_without_weights_reads_the_graphs_tensors_in_place(tmp_path):
    module = QuantizedLayer()
    traced = torch.fx.symbolic_trace(module)
    example = example_inputs()
    path = _package_without_weights(traced, example, tmp_path / "layer.pt2")
    assert reads_only_graph_constants(tmp_path / "layer.pt2", traced, torch.device("cpu"))

    package = torch._inductor.aoti_load_package(path)
    assert reads_graph_constants(package)
    hand_over_constants(package, traced)
    before = package(*example)
    assert torch.equal(before, module(*example))

    traced.packed[: traced.packed.numel() // 2] = 0   # the package sees the graph's own memory change
    after = package(*example)
    assert not torch.equal(after, before)
    assert torch.equal(after, module(*example))


def test_a_constant_of_inductors_making_keeps_the_weights_in_the_package(tmp_path):
    traced = torch.fx.symbolic_trace(FoldedWeight())
    _package_without_weights(traced, (torch.randn(2, 8),), tmp_path / "folded.pt2")
    assert not reads_only_graph_constants(tmp_path / "folded.pt2", traced, torch.device("cpu"))


def test_only_cpu_graphs_whose_weights_are_all_quantized_are_packaged_without_them():
    quantized = torch.fx.symbolic_trace(QuantizedLayer())
    assert may_read_graph_constants(quantized, torch.device("cpu"))
    assert not may_read_graph_constants(quantized, torch.device("cuda"))
    linear = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),)).module()
    assert not may_read_graph_constants(linear, torch.device("cpu"))
    int8 = torch.export.export(Int8Projection(), (torch.randn(2, 32).bfloat16(),)).module()
    assert not may_read_graph_constants(int8, torch.device("cpu"))


@pytest.mark.slow
def test_a_q4_aoti_engines_packages_share_the_graphs_weights(checkpoints, tmp_path):
    target, _ = checkpoints("llama")
    for backend in ("aoti", "eager"):
        compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / backend, dtype="bfloat16",
                                      max_seq_len=96, quantize="q4", backend=backend))
    engine, eager = load_engine(tmp_path / "aoti"), load_engine(tmp_path / "eager")
    graph = engine.context.graphs["target"]
    narrow, wide = graph.narrow.package.graph_constants, graph.wide.package.graph_constants
    assert narrow and narrow.keys() == wide.keys() and all(narrow[name] is wide[name] for name in narrow)
    for prompt in ([3, 4, 5], list(range(7, 40))):
        assert engine.generate_ids(prompt, 24).token_ids == eager.generate_ids(prompt, 24).token_ids
