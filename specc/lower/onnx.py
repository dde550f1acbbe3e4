"""`onnx`: ONNX graphs (`compiled/<graph>.onnx`) exported at compile time, run by onnxruntime.

Each graph is exported with `torch.onnx.export(..., dynamo=True)` at opset
`ONNX_OPSET` from example inputs built from its declared signature, its `q`,
`kv` and `r` dimensions dynamic. ONNX cannot write the caller's KV cache in place, so
the export is of a rewritten copy (`onnx_cache_rows.expose_cache_writes`)
that returns the rows each layer writes; at run time
(`onnx_session.OnnxSessionGraph`) those rows are copied into the torch
caches at the cache slots. Inputs, caches included, are bound to the
session by pointer (IO binding), and outputs are written into tensors
allocated from the signature, so outside the graph a step copies only q
rows per cache; inside it, the functional write copies the attended window
(`kv` rows, one ScatterElements), where the torch graph reads a view.
An engine on CUDA runs on CUDAExecutionProvider (onnxruntime-gpu), its device
tensors bound where they are; an engine on the CPU on CPUExecutionProvider
alone. onnxruntime has no bfloat16 CPU kernels, so
a bfloat16 engine is refused at packaging unless the CUDA provider is there.

Segments a method calls at run time (e.g. skippable sublayers, when the
method compiles them) write the caches in place themselves and are not
exported: like `aoti`, this backend compiles them with Inductor (on their
first call). Verification always runs the ONNX graph.

Graphs calling custom operators (`torch.library.custom_op`) export only if
`ONNX_TRANSLATIONS` maps the operator to an onnxscript function; otherwise
packaging stops with an error naming the operator. specc's own
`specc::tree_attention` (`--kernels`) is translated by `onnx_kernels`;
`specc::greedy_accept` needs no translation, as it is never inside a graph.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.fx as fx

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import output_node
from specc.graph.signature import dynamic_dims, example_inputs
from specc.kernels import KERNELS
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.inductor import compile_dynamic
from specc.lower.onnx_cache_rows import expose_cache_writes
from specc.lower.onnx_kernels import tree_attention as tree_attention_onnx
from specc.lower.onnx_session import ROWS_SUFFIX, OnnxSessionGraph, execution_providers, import_onnxruntime
from specc.host.threads import torch_threads

log = logging.getLogger("specc")

# Custom operator (OpOverload or OpOverloadPacket) -> onnxscript function, passed to the exporter
# as its `custom_translation_table`; packages providing custom kernels register theirs here.
ONNX_TRANSLATIONS: dict = {KERNELS["tree_attention"].op: tree_attention_onnx}
_EXPORTABLE_NAMESPACES = ("aten", "prims")
# Opset 23 has Attention (SDPA, GQA included, in one node) and RMSNormalization: a decode step
# runs far fewer nodes than at opset 18, and onnxruntime's per-node cost is what
# kept `none` from the bandwidth bound (docs/backends.md#onnx).
ONNX_OPSET = 23
_EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def onnx_file_name(graph: str) -> str:
    return f"{graph}.onnx"


class OnnxBackend(Backend):
    name = "onnx"
    help = "export each graph to ONNX at compile time (compiled/*.onnx), run it with onnxruntime"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    ahead_of_time = True

    def check_available(self) -> None:
        _require_export_packages()

    def package(self, target: LoweringTarget, artifacts: Path) -> list[str]:
        _check_dtype_runs_here(target.dtype)
        return export_onnx(target, artifacts)

    def load(self, target: LoweringTarget, artifacts: Path, manifest: dict):
        ort = import_onnxruntime()
        if target.device.type == "cuda" and "CUDAExecutionProvider" not in execution_providers(ort):
            raise UsageError(f"--device {target.device}: this onnxruntime ({ort.__version__}) has no CUDA execution "
                             f"provider; pip install onnxruntime-gpu, or load the engine with --device cpu")
        path = artifacts / onnx_file_name(target.name)
        if not path.is_file():
            raise UsageError(f"the engine has no ONNX graph for {target.name!r}; "
                             f"it was compiled for backend {manifest['backend']!r}")
        returns_sequence = isinstance(output_node(target.module.graph).args[0], (tuple, list))
        return OnnxSessionGraph(path, target.signature, target.dtype, target.sizes, returns_sequence, target.device)

    def lower_segment(self, segment):
        return compile_dynamic(segment)

    def generation_scope(self, run_time_segments: bool):
        """Torch on one thread while the engine generates, unless it runs torch segments:
        between session calls torch does only small ops (argmax, indexing), and its OpenMP
        threads fought onnxruntime's pool for the cores and slowed a shallow-exit
        self-speculative engine, while plain decoding was unchanged (measured: benchmarks/NOTES.md,
        "ONNX Runtime on 2 threads")."""
        return contextlib.nullcontext() if run_time_segments else torch_threads(1)


def export_onnx(target: LoweringTarget, artifacts: Path) -> list[str]:
    """Write `<graph>.onnx` (and `<graph>.onnx.data` for weights past 2 GB); return the file names."""
    _require_export_packages()
    start = time.perf_counter()
    rewritten = expose_cache_writes(target.module, target.signature)
    check_exportable_ops(rewritten.module)
    drop_needless_gqa(rewritten.module, target.sizes["kv_heads"])
    output_names = [*target.signature.output_names,
                    *(target.signature.inputs[r.cache_input].name + ROWS_SUFFIX for r in rewritten.cache_rows)]
    path = artifacts / onnx_file_name(target.name)
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                rewritten.module.eval(), tuple(example_inputs(target.signature, target.sizes, target.dtype)),
                dynamo=True, opset_version=ONNX_OPSET,
                dynamic_shapes=tuple(dynamic_dims(target.signature, target.max_seq_len)),
                input_names=target.signature.input_names, output_names=output_names,
                custom_translation_table=ONNX_TRANSLATIONS or None, verbose=False)
            program.save(str(path))
    except Exception as exc:
        raise SpeccError(f"ONNX export of graph {target.name!r} failed: "
                         f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}") from exc
    files = sorted(p.name for p in artifacts.glob(f"{path.name}*"))
    size = sum((artifacts / name).stat().st_size for name in files)
    log.info("onnx: exported graph %s in %.1fs (%s, %.1f MB)", target.name, time.perf_counter() - start,
             ", ".join(files), size / 1e6)
    return files


def check_exportable_ops(module: fx.GraphModule) -> None:
    """Stop before export at the first operator ONNX has no translation for."""
    for node in module.graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if op.namespace in _EXPORTABLE_NAMESPACES or op in ONNX_TRANSLATIONS or op.overloadpacket in ONNX_TRANSLATIONS:
            continue
        raise SpeccError(f"graph node {node.name} calls custom operator {op.name()}, which has no ONNX "
                         f"translation; register one in specc.lower.onnx.ONNX_TRANSLATIONS or choose "
                         f"another backend")


def drop_needless_gqa(module: fx.GraphModule, kv_heads: int) -> None:
    """Clear `enable_gqa` on attention calls whose query and key have as many heads: Hugging Face
    sets it for every model, and the exporter's translation asserts fewer key heads under it
    (multi-head checkpoints, such as Qwen2 with as many key/value heads as query heads)."""
    for node in module.graph.nodes:
        if node.target is not torch.ops.aten.scaled_dot_product_attention.default or not node.kwargs.get("enable_gqa"):
            continue
        query = node.args[0].meta.get("val")
        if query is not None and query.shape[1] == kv_heads:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "enable_gqa"}
    module.recompile()


def _check_dtype_runs_here(dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and "CUDAExecutionProvider" not in execution_providers(import_onnxruntime()):
        raise UsageError("onnxruntime has no bfloat16 kernels on the CPU, so a bfloat16 ONNX engine could not "
                         "run here; compile with --dtype float32 or float16 (or use onnxruntime-gpu)")


@contextmanager
def _quiet_exporter():
    """Silence the exporter's notes (axis names, deprecations, optional torchvision
    operators, one line per deduplicated initializer): specc logs one line per
    graph instead, and a failed export raises."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for logger in loggers:
                logger.setLevel(logging.ERROR)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _require_export_packages() -> None:
    missing = [name for name in _EXPORT_PACKAGES if not _imports(name)]
    if missing:
        raise UsageError(f"backend 'onnx' needs {', '.join(missing)}: pip install 'specc[onnx]'")


def _imports(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


BACKEND = OnnxBackend()
