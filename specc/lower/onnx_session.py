"""Run an exported ONNX graph with onnxruntime under the torch graph's call convention.

`OnnxSessionGraph` takes the graph's inputs as torch tensors, positionally
(as `CachedModel.run_all` passes them), binds their memory to the session
(IO binding: no input is copied, the KV caches included), runs into output
tensors it allocates from the declared signature, writes the cache rows the
graph returned into the caches (see `onnx_cache_rows`), and returns the
graph's own outputs in the structure the FX graph returns them.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from specc.errors import SpeccError, UsageError
from specc.graph.signature import CACHE_ROLE, DYNAMIC_DIMS, GraphSignature, concrete_shape
from specc.lower.onnx_cache_rows import SLOTS_ROLE, write_rows_into_caches

ROWS_SUFFIX = "_rows"
# ONNX TensorProto element types (onnxruntime's IO binding takes them as integers).
_ELEMENT_TYPES = {torch.float32: 1, torch.int64: 7, torch.bool: 9, torch.float16: 10, torch.bfloat16: 16}


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise UsageError("backend 'onnx' needs onnxruntime: pip install 'specc[onnx]'") from None
    return onnxruntime


def execution_providers(onnxruntime) -> list[str]:
    available = onnxruntime.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def session_providers(onnxruntime, device: torch.device) -> list:
    """The providers of a session for an engine on `device`: the CUDA provider on that GPU
    (falling back to the CPU for ops it lacks) when the engine is on CUDA, else the CPU's
    alone, so a CPU engine's tensors are never staged through a GPU that happens to be there."""
    if device.type == "cuda" and "CUDAExecutionProvider" in execution_providers(onnxruntime):
        return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


_shared_pool_threads: int | None = None   # size of the process's one intra-op pool, once created


def session_options(ort):
    """Options under which every specc session shares one intra-op thread pool,
    sized by torch's thread count (so OMP_NUM_THREADS / `--threads` govern both
    runtimes) when the first session is made. Why shared: a pool of its own per
    session keeps its threads spinning after each run, so a method that
    alternates graphs (draft, then verify) ran each call beside the previous
    session's spinning threads: a self-speculative round (shallow, adapter and
    deep graphs) on 2 cores took 65 ms instead of 27 ms. One thread needs no pool and keeps per-session threads."""
    global _shared_pool_threads
    options = ort.SessionOptions()
    threads = torch.get_num_threads()
    if _shared_pool_threads is None and threads == 1:
        options.intra_op_num_threads = 1
        return options
    if _shared_pool_threads is None:
        importlib.import_module("onnxruntime.capi._pybind_state").set_global_thread_pool_sizes(threads, 1)
        _shared_pool_threads = threads
    options.use_per_session_threads = False
    return options


class OnnxSessionGraph:
    def __init__(self, path: Path, signature: GraphSignature, float_dtype: torch.dtype, sizes: dict[str, int],
                 returns_sequence: bool, device: torch.device = torch.device("cpu")):
        ort = import_onnxruntime()
        options = session_options(ort)
        providers = session_providers(ort, device)
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:   # onnxruntime's own exception types, not importable by name
            names = ", ".join(p if isinstance(p, str) else p[0] for p in providers)
            raise SpeccError(f"onnxruntime ({names}) cannot run {path.name}: "
                             f"{str(exc).strip().splitlines()[0]}") from exc
        self.signature = signature
        self.float_dtype = float_dtype
        self.sizes = sizes
        self.returns_sequence = returns_sequence
        self._session_inputs = {i.name for i in self.session.get_inputs()}   # export drops unused inputs
        self._output_names = [o.name for o in self.session.get_outputs()]
        self._cache_inputs = self._rows_targets()
        roles = [spec.role for spec in signature.inputs]
        self._slots_input = roles.index(SLOTS_ROLE)
        # One binding, updated only where a tensor's memory or shape changed: the caches stay
        # bound across steps. Calls are sequential (one generation at a time per engine).
        self._binding = self.session.io_binding()
        self._bound: dict[str, tuple] = {}
        self._rows_buffers: dict[int, list[torch.Tensor]] = {}   # by row count, consumed within a call

    def _rows_targets(self) -> list[int]:
        """For each cache-rows output (after the graph's own), the input index of its cache."""
        declared = self.signature.output_names
        if self._output_names[:len(declared)] != declared:
            raise SpeccError(f"the ONNX graph's outputs {self._output_names} do not start with the declared "
                             f"outputs {declared}; recompile the engine")
        caches = {spec.name: i for i, spec in enumerate(self.signature.inputs) if spec.role == CACHE_ROLE}
        rows = [name.removesuffix(ROWS_SUFFIX) for name in self._output_names[len(declared):]]
        unknown = [name for name in rows if name not in caches]
        if unknown:
            raise SpeccError(f"the ONNX graph returns rows for unknown caches {unknown}; recompile the engine")
        return [caches[name] for name in rows]

    def __call__(self, *inputs: torch.Tensor):
        if len(inputs) != len(self.signature.inputs):
            raise SpeccError(f"the graph takes {len(self.signature.inputs)} inputs "
                             f"({', '.join(self.signature.input_names)}), got {len(inputs)}")
        inputs = tuple(t.contiguous() for t in inputs)   # a no-op for the caches
        for spec, tensor in zip(self.signature.inputs, inputs):
            if spec.name in self._session_inputs:
                self._bind(self._binding.bind_input, spec.name, tensor)
        outputs = self._allocate_outputs(inputs)
        for name, tensor in zip(self._output_names, outputs):
            self._bind(self._binding.bind_output, name, tensor)
        self.session.run_with_iobinding(self._binding)
        declared = len(self.signature.outputs)
        write_rows_into_caches([inputs[i] for i in self._cache_inputs], outputs[declared:],
                               inputs[self._slots_input])
        results = outputs[:declared]
        return tuple(results) if self.returns_sequence else results[0]

    def _allocate_outputs(self, inputs) -> list[torch.Tensor]:
        sizes = {**self.sizes, **_dynamic_sizes(self.signature, inputs)}
        device = inputs[0].device
        outputs = [torch.empty(concrete_shape(spec, sizes), dtype=spec.torch_dtype(self.float_dtype), device=device)
                   for spec in self.signature.outputs]
        rows = inputs[self._slots_input].numel()
        if rows not in self._rows_buffers:
            self._rows_buffers[rows] = [
                torch.empty(c.shape[0], c.shape[1], rows, c.shape[3], dtype=c.dtype, device=device)
                for c in (inputs[i] for i in self._cache_inputs)]
        return outputs + self._rows_buffers[rows]

    def _bind(self, bind, name: str, tensor: torch.Tensor) -> None:
        bound = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype, tensor.device)
        if self._bound.get(name) != bound:
            _bind(bind, name, tensor)
            self._bound[name] = bound


def _dynamic_sizes(signature: GraphSignature, inputs) -> dict[str, int]:
    """The values of `q`, `kv` and `r` in this call, read off the inputs that carry them."""
    sizes = {}
    for spec, tensor in zip(signature.inputs, inputs):
        for axis, dim in enumerate(spec.shape):
            if dim in DYNAMIC_DIMS:
                sizes.setdefault(dim, tensor.shape[axis])
    return sizes


def _bind(bind, name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in _ELEMENT_TYPES:
        raise SpeccError(f"tensor {name!r} has dtype {tensor.dtype}, which the ONNX backend does not bind "
                         f"(supported: {', '.join(map(str, _ELEMENT_TYPES))})")
    device = tensor.device
    bind(name, device.type, device.index or 0, _ELEMENT_TYPES[tensor.dtype], list(tensor.shape), tensor.data_ptr())
