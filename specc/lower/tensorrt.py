"""`tensorrt`: TensorRT engines (`compiled/<graph>.plan`) built from the ONNX export.

NEVER RUN: this module was written against the documented TensorRT 10
Python API (trt.Builder, trt.OnnxParser, optimization profiles,
`Runtime.deserialize_cuda_engine`, `execute_async_v3`) on a machine with no
GPU, where no tensorrt wheel can be installed. Only the refusal path is
tested: without the `tensorrt` package or a CUDA device, `package` and
`load` raise a UsageError naming what is missing. `--backend onnx` writes
the same ONNX graphs (`compiled/<graph>.onnx`) for `trtexec --onnx`.

Build: each graph is exported exactly as the `onnx` backend exports it
(cache writes returned as rows, see `onnx_cache_rows`) and kept beside the
plan; the network is parsed from it strongly typed (the precision the
graph was exported in, so verification stays exact); one optimization
profile covers `q`, `kv` and `r` from 1 to the engine's max sequence length,
tuned for a one-token step (q = 1) over half the context.

Run: an engine loaded with `--device cuda` keeps its KV caches (and every
other tensor) on the GPU, bound here by pointer; an engine loaded for the CPU
has each call's inputs staged onto the GPU and outputs and cache rows copied
back. Segments a method calls at run time go through Inductor, as with
`aoti` and `onnx`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import output_node
from specc.graph.signature import CACHE_ROLE, GraphSignature, concrete_shape
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.inductor import compile_dynamic
from specc.lower.onnx import export_onnx, onnx_file_name
from specc.lower.onnx_cache_rows import SLOTS_ROLE, write_rows_into_caches
from specc.lower.onnx_session import ROWS_SUFFIX

log = logging.getLogger("specc")


def plan_file_name(graph: str) -> str:
    return f"{graph}.plan"


def import_tensorrt():
    """The tensorrt module, when it imports and a CUDA device is present."""
    try:
        import tensorrt
    except ImportError:
        missing = "the tensorrt package (pip install tensorrt, on a machine with CUDA)"
    else:
        if torch.cuda.is_available():
            return tensorrt
        missing = "a CUDA device (torch.cuda.is_available() is False)"
    raise UsageError(f"backend 'tensorrt' needs {missing}; use --backend onnx instead, "
                     f"whose compiled/*.onnx graphs can be handed to trtexec --onnx")


class TensorRTBackend(Backend):
    name = "tensorrt"
    help = "build TensorRT engines (compiled/*.plan) from the ONNX export; needs tensorrt and a CUDA device"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    ahead_of_time = True

    def check_available(self) -> None:
        import_tensorrt()

    def package(self, target: LoweringTarget, artifacts: Path) -> list[str]:
        trt = import_tensorrt()
        files = export_onnx(target, artifacts)
        start = time.perf_counter()
        plan = build_plan(trt, artifacts / onnx_file_name(target.name), target)
        (artifacts / plan_file_name(target.name)).write_bytes(plan)
        log.info("tensorrt: built graph %s in %.1fs (%.1f MB)", target.name, time.perf_counter() - start,
                 len(plan) / 1e6)
        return [*files, plan_file_name(target.name)]

    def load(self, target: LoweringTarget, artifacts: Path, manifest: dict):
        trt = import_tensorrt()
        path = artifacts / plan_file_name(target.name)
        if not path.is_file():
            raise UsageError(f"the engine has no TensorRT plan for graph {target.name!r}; "
                             f"it was compiled for backend {manifest['backend']!r}")
        returns_sequence = isinstance(output_node(target.module.graph).args[0], (tuple, list))
        return TensorRTGraph(trt, path, target.signature, returns_sequence)

    def lower_segment(self, segment):
        return compile_dynamic(segment)


def build_plan(trt, onnx_path: Path, target: LoweringTarget) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # TensorRT 10 networks are always explicit-batch; strongly typed keeps the exported precision.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SpeccError(f"TensorRT could not parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.add_optimization_profile(_profile(builder, network, target))
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SpeccError(f"TensorRT failed to build graph {target.name!r}; rerun with --verbose for its log")
    return bytes(plan)


def _profile(builder, network, target: LoweringTarget):
    """min/opt/max shapes of every network input: `q`, `kv` and `r` from 1 to max_seq_len."""
    ranges = {"min": {"q": 1, "kv": 1, "r": 1}, "opt": {"q": 1, "kv": max(1, target.max_seq_len // 2), "r": 1},
              "max": {"q": target.max_seq_len, "kv": target.max_seq_len, "r": target.max_seq_len}}
    specs = {spec.name: spec for spec in target.signature.inputs}
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):   # the ONNX export drops inputs a graph never reads
        spec = specs[network.get_input(index).name]
        shapes = [concrete_shape(spec, {**target.sizes, **ranges[key]}) for key in ("min", "opt", "max")]
        profile.set_shape(spec.name, *shapes)
    return profile


class TensorRTGraph:
    """A deserialized plan with the torch graph's call convention (see `OnnxSessionGraph`)."""

    def __init__(self, trt, path: Path, signature: GraphSignature, returns_sequence: bool):
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise SpeccError(f"TensorRT could not load {path}; plans are specific to the TensorRT version "
                             f"and GPU they were built on: recompile the engine")
        self.context = self.engine.create_execution_context()
        self.signature = signature
        self.returns_sequence = returns_sequence
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._engine_inputs = {n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        declared = signature.output_names
        rows = [n for n in names if n not in self._engine_inputs and n not in declared]
        self._output_names = declared + rows   # the graph's own outputs first, as in the ONNX export
        caches = {spec.name: i for i, spec in enumerate(signature.inputs) if spec.role == CACHE_ROLE}
        self._cache_inputs = [caches[n.removesuffix(ROWS_SUFFIX)] for n in rows]
        self._slots_input = [spec.role for spec in signature.inputs].index(SLOTS_ROLE)

    def __call__(self, *inputs: torch.Tensor):
        host = inputs[0].device
        staged = [t.to("cuda").contiguous() for t in inputs]
        for spec, tensor in zip(self.signature.inputs, staged):
            if spec.name in self._engine_inputs:
                self.context.set_input_shape(spec.name, tuple(tensor.shape))
                self.context.set_tensor_address(spec.name, tensor.data_ptr())
        outputs = []
        for name in self._output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            outputs.append(torch.empty(shape, dtype=_torch_dtype(self.engine.get_tensor_dtype(name)), device="cuda"))
            self.context.set_tensor_address(name, outputs[-1].data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise SpeccError("TensorRT execution failed; rerun with --verbose for its log")
        stream.synchronize()
        declared = len(self.signature.outputs)
        write_rows_into_caches([inputs[i] for i in self._cache_inputs],
                               [rows.to(inputs[i].device) for i, rows in zip(self._cache_inputs, outputs[declared:])],
                               inputs[self._slots_input])
        results = [t.to(host) for t in outputs[:declared]]
        return tuple(results) if self.returns_sequence else results[0]


def _torch_dtype(trt_dtype) -> torch.dtype:
    import tensorrt as trt

    table = {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16,
             trt.int64: torch.int64, trt.int32: torch.int32, trt.bool: torch.bool}
    if trt_dtype not in table:
        raise SpeccError(f"TensorRT output dtype {trt_dtype} has no torch equivalent here")
    return table[trt_dtype]


BACKEND = TensorRTBackend()
