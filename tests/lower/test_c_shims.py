"""A CPU package calls specc's quantized matmul, row attention and decoder chains as C functions,
not through its proxy executor, and computes what eager PyTorch does."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import torch

from specc.lower import c_shims
from tests.kernels.test_decoder_chain import HEADS, NEXT, _caches, _rotary, _rows, _weights
from tests.lower.quantized_layer import QuantizedLayer, example_inputs


def test_the_operators_a_graph_calls_get_shims_on_the_cpu_only():
    traced = torch.fx.symbolic_trace(QuantizedLayer())
    assert c_shims.shimmed_operators(traced) == ["blocked_matmul", "row_attention"]
    config = c_shims.shim_config(traced, torch.device("cpu"))["aot_inductor.custom_ops_to_c_shims"]
    assert set(config) == {torch.ops.specc.blocked_matmul.default, torch.ops.specc.row_attention.default}
    assert c_shims.shim_config(traced, torch.device("cuda")) == {}
    assert c_shims.shim_config(torch.fx.symbolic_trace(torch.nn.Linear(4, 4)), torch.device("cpu")) == {}


def test_it_looks_for_the_operators_in_an_interpreter_that_imported_nothing_else():
    """Loading a bfloat16 engine imports no kernel module before asking which shims a graph needs."""
    check = ("import torch; from specc.lower import c_shims; "
             "assert c_shims.shimmed_operators(torch.fx.symbolic_trace(torch.nn.Linear(2, 2))) == []")
    subprocess.run([sys.executable, "-c", check], check=True)


def test_a_package_calls_the_shims_directly_and_computes_the_same_bits(tmp_path):
    module = QuantizedLayer()
    traced = torch.fx.symbolic_trace(module)
    example = example_inputs()
    with torch._inductor.config.patch(c_shims.shim_config(traced, torch.device("cpu"))):
        exported = torch.export.export(traced, example)
        path = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "layer.pt2"))
    with zipfile.ZipFile(path) as package:
        wrapper = next(package.read(name).decode() for name in package.namelist() if name.endswith("wrapper.cpp"))
    assert "aoti_torch_cpu_blocked_matmul(" in wrapper and "aoti_torch_cpu_row_attention(" in wrapper
    assert "proxy_executor_call_function(" not in wrapper

    c_shims.expose(traced, torch.device("cpu"))
    loaded = torch._inductor.aoti_load_package(path)
    assert torch.equal(loaded(*example), module(*example))


class BiasedLayerIntoCache(torch.nn.Module):
    """A decoder chain taken on to the caches with Qwen2's q/k/v bias, its weights the module's own."""

    def __init__(self):
        super().__init__()
        weights = _weights()
        self.register_buffer("pack", weights[0])
        self.register_buffer("post_norm", weights[1])
        self.register_buffer("next_norm", weights[2])
        self.register_buffer("bias", torch.randn(NEXT, generator=torch.Generator().manual_seed(4)).bfloat16())
        self.sizes = weights[3:]

    def forward(self, attention, residual, cos, sin, positions, k_cache, v_cache):
        return torch.ops.specc.decoder_chain_into_cache(attention, residual, self.pack, self.post_norm, self.next_norm,
                                                        *self.sizes, cos, sin, positions, k_cache, v_cache, HEADS,
                                                        self.bias)


def test_a_package_hands_the_chain_its_optional_bias(tmp_path):
    module = BiasedLayerIntoCache()
    cos, sin = _rotary(2)
    example = (*_rows(2), cos, sin, torch.tensor([3, 4]), *_caches())
    exported = torch.export.export(module, example)
    with torch._inductor.config.patch(c_shims.shim_config(exported.module(), torch.device("cpu"))):
        path = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "chain.pt2"))
    with zipfile.ZipFile(path) as package:
        wrapper = next(package.read(name).decode() for name in package.namelist() if name.endswith("wrapper.cpp"))
    assert "aoti_torch_cpu_decoder_chain_into_cache(" in wrapper

    c_shims.expose(exported.module(), torch.device("cpu"))
    loaded = torch._inductor.aoti_load_package(path)
    packaged_caches, eager_caches = _caches(), _caches()
    got = loaded(*example[:5], *packaged_caches)
    want = module(*example[:5], *eager_caches)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(packaged_caches, eager_caches)) and eager_caches[0].any()
    unbiased = torch.ops.specc.decoder_chain_into_cache(*example[:2], *_weights(), *example[2:5], *_caches(), HEADS)
    assert not torch.equal(unbiased[1], want[1])


class StackOfTwoLayers(torch.nn.Module):
    """Two decoder layers in one `decoder_stack` call, writing into the caches it is given."""

    def __init__(self):
        super().__init__()
        layers = [_weights(seed) for seed in range(2)]
        for i, weights in enumerate(layers):
            self.register_buffer(f"pack{i}", weights[0])
            self.register_buffer(f"post_norm{i}", weights[1])
            self.register_buffer(f"next_norm{i}", weights[2])
        self.bits = [b for weights in layers for b in weights[3:7]]
        self.sizes = layers[0][7:]

    def forward(self, query, mask, residual, cos, sin, positions, k0, v0, k1, v1, k2, v2):
        return torch.ops.specc.decoder_stack(query, mask, 0.2, residual, [self.pack0, self.pack1],
                                             [self.post_norm0, self.post_norm1], [self.next_norm0, self.next_norm1],
                                             self.bits, *self.sizes, cos, sin, positions, mask.shape[3],
                                             [k0, k1, k2], [v0, v1, v2], HEADS, [])


def test_a_package_runs_a_stack_through_its_shim_and_writes_the_caches(tmp_path):
    module = StackOfTwoLayers()
    cos, sin = _rotary(2)
    g = torch.Generator().manual_seed(6)
    query = torch.randn(1, HEADS, 2, _caches()[0].shape[3], generator=g).bfloat16()
    mask = torch.ones(1, 1, 2, 6, dtype=torch.bool).tril(diagonal=4)
    example = (query, mask, _rows(2)[1], cos, sin, torch.tensor([4, 5]))
    filled = [c.normal_(generator=g) for _ in range(3) for c in _caches()]
    exported = torch.export.export(module, (*example, *[c.clone() for c in filled]))
    with torch._inductor.config.patch(c_shims.shim_config(exported.module(), torch.device("cpu"))):
        path = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "stack.pt2"))
    with zipfile.ZipFile(path) as package:
        wrapper = next(package.read(name).decode() for name in package.namelist() if name.endswith("wrapper.cpp"))
    assert "aoti_torch_cpu_decoder_stack(" in wrapper and "proxy_executor_call_function(" not in wrapper

    c_shims.expose(exported.module(), torch.device("cpu"))
    loaded = torch._inductor.aoti_load_package(path)
    packaged_caches, eager_caches = [c.clone() for c in filled], [c.clone() for c in filled]
    got = loaded(*example, *packaged_caches)
    want = module(*example, *eager_caches)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(packaged_caches, eager_caches))
    assert not torch.equal(eager_caches[2], filled[2]) and torch.equal(eager_caches[0], filled[0])
