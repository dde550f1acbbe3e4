"""`aoti`: AOTInductor packages (`compiled/<graph>.pt2`) built at compile time.

Each graph is exported with its `q`, `kv` and `r` dimensions dynamic, from
example inputs built from its declared signature, and packaged; loading
needs no recompilation. Segments a method calls at run time (e.g. skippable
sublayers) cannot be packaged separately: they go through Inductor.

Measurements behind each choice below:
docs/backends.md#measurements-behind-the-lowering-choices.

Packages are built with Inductor's freezing: the weights become constants
and, in float32, every linear layer runs oneDNN on a prepacked weight
(residual adds fused in): float32 steps run faster than with the default
package, with the same argmax. In bfloat16 oneDNN packs nothing on a CPU
without AVX-512 BF16 or AMX, and freezing leaves the step time as it was.
The package holds one more copy of a tied LM head.

On the CPU each linear is also autotuned (`max_autotune`) between oneDNN and
Inductor's C++ GEMM template, at the example shape (a few query rows): the
template won the decode-sized linears and made a step faster than oneDNN
alone, at the price of a longer packaging.

A kernel tuned at a few rows is slow for many: tuned at 3 query rows only, a
forward of a verification tree's rows cost several plain steps. Each graph is
therefore packaged twice: tuned at `NARROW_ROWS` query rows (decode steps and
short chains) and at `WIDE_ROWS` (trees, prompt chunks), and a call with more
than `NARROW_MAX_ROWS` rows runs the wide package (`benchmarks/verify_cost.py`
compares them). The price: twice the packaging time, and, where freezing makes
constants of its own (prepacked float linears), the weights frozen into both
packages (twice the memory and disk); a CPU graph whose weights are all quantized
is packaged without them, and both packages read the graph's tensors in place
(`aoti_constants`). In bfloat16 the narrow
package was first tuned at 2 rows with one-row calls run as two identical
rows, because the packaged kernels ran one row slower than two. It is now
tuned at `NARROW_ROWS_BF16` = 4 and every call of fewer rows runs padded to 4
(`PaddedRows`), which makes verifying up to 4 rows exact (`exact_rows`). A
graph whose every linear is quantized pads only its attention rows itself (or,
under q4/q6/q8, computes them one by one: `passes/use_row_attention.py`) and
runs calls as they come (its narrow package serves 1-3 rows: `ALIKE_NARROW_ROWS`):
a q4 decode step then costs one row's work, not four.

Inductor bakes the thread count into each GEMM kernel it generates (the
torch threads at packaging time; a kernel built for one thread never runs
in parallel). Packages are therefore built for `idle_machine_threads()`, the
physical cores `specc run` uses on an idle machine, whatever threads the
compile itself runs with (`--threads 1` to keep the machine usable while
training, say). A GEMM built for two threads still runs correctly on one.
Packaged for one thread and run on two, a verification of four rows cost
noticeably more than a decode step; packaged for two, about the same.

A decode step runs some 300 small kernels (norms, rotary embeddings, cache
writes, gates) besides the GEMMs, and Inductor splits any of them with more
than `min_chunk_size` (512) elements per thread over the OpenMP threads: a
fork and a join barrier for a few microseconds of work. libgomp took a
sizeable share of a bfloat16 decode step's `perf` samples, while the GEMMs
themselves read their weights at about the machine's sum bandwidth. Packages
for the CPU therefore keep kernels of fewer than `MIN_CHUNK_PER_THREAD`
elements per thread on one thread, which made a bfloat16 decode step faster;
a larger threshold gained nothing more.

specc's own CPU operators (the quantized matmul and row attention) are called
from a package as plain C functions (`c_shims`), not through the package's
proxy executor.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from specc.errors import SpeccError, UsageError
from specc.graph.nodes import rows_computed_alike
from specc.graph.signature import dynamic_dims, example_inputs
from specc.lower import c_shims
from specc.lower.aoti_constants import (CONSTANTS_KEY, FROM_GRAPH, PACKAGED_WITHOUT_CONSTANTS, hand_over_constants,
                                        may_read_graph_constants, reads_graph_constants,
                                        reads_only_graph_constants)
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.exact_rounding import exact_rounding
from specc.lower.inductor import compile_dynamic
from specc.runtime.exactness import EXACT_ROWS, RowExactness, pads_itself
from specc.lower.row_padding import PaddedRows, q_axes, row_padding
from specc.lower.template_cache import templates_parsed_once
from specc.host.threads import idle_machine_threads, torch_threads
from specc.host.collapsed_pages import new_memory_on_huge_pages
from specc.host.extraction_dir import extraction_on_disk


class AOTInductorBackend(Backend):
    name = "aoti"
    help = "package each graph with AOTInductor at compile time (compiled/*.pt2); loads without recompiling"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True
    ahead_of_time = True
    # In bfloat16 every call of up to `NARROW_ROWS_BF16` rows runs padded to exactly that many, so a
    # verification of that many rows runs the very kernels of a decode step, row for row. Unpadded,
    # the row count changed the rounding enough to flip bfloat16 near-ties; padded to 4 rows, every
    # row matched except where the call's rows straddled a key block (`rows_in_key_block`, which the
    # loop respects). Measurements: docs/backends.md#measurements-behind-the-lowering-choices.
    # A graph whose every linear is specc's or PyTorch's quantized kernel and whose attention pads
    # or computes its own rows (`graph.nodes.rows_computed_alike`) runs as called: the package keeps those
    # kernels as calls, and the rest of what Inductor generates computes each row on its own
    # (tests/engine/test_exact_rows.py), so a one-row decode step skips three rows of work.
    row_exactness = RowExactness.PADDED_UNLESS_ALIKE

    def package(self, target: LoweringTarget, artifacts: Path) -> list[str]:
        rows, serves = _narrow_rows(target)
        files = [_package(target, artifacts / f"{target.name}.pt2", rows, {SERVES_ROWS: str(serves)})]
        if _query_axis(target) is not None and target.device.type == "cpu":   # see WIDE_ROWS
            files.append(_package(target, artifacts / f"{target.name}{WIDE_SUFFIX}", WIDE_ROWS))
        return files

    def load(self, target: LoweringTarget, artifacts: Path, manifest: dict):
        package = artifacts / f"{target.name}.pt2"
        if not package.is_file():
            raise UsageError(f"the engine has no AOTInductor package for graph {target.name!r}; "
                             f"it was compiled for backend {manifest['backend']!r}")
        built_with = manifest["versions"]["torch"]
        if built_with != torch.__version__:
            raise SpeccError(f"AOTInductor packages were built with torch {built_with}, this is torch "
                             f"{torch.__version__}; recompile the engine")
        c_shims.expose(target.module, target.device)
        narrow = _load_package(package, target)
        # Packages from before alike graphs ran unpadded record nothing: they serve up to
        # NARROW_MAX_ROWS rows, traced at 4.
        serves = int(narrow.get_metadata().get(SERVES_ROWS, NARROW_MAX_ROWS))
        wide, axis = artifacts / f"{target.name}{WIDE_SUFFIX}", _query_axis(target)
        if axis is not None and wide.is_file():   # engines packaged before the wide variant have none
            narrow = RowDispatch(narrow, _load_package(wide, target), *axis, serves)
        if _computes_rows_alike(target) and not (serves == ALIKE_NARROW_MAX_ROWS and wide.is_file()):
            return PaddedRows(narrow, row_padding(target, EXACT_ROWS))   # the engine runs it as called: pad here
        return narrow

    def lower_segment(self, segment):
        return compile_dynamic(segment)


NARROW_ROWS, WIDE_ROWS = 3, 12   # query rows of the example each package is tuned at
NARROW_ROWS_BF16 = EXACT_ROWS      # and every bfloat16 call of fewer rows runs padded to this many
NARROW_MAX_ROWS = 4               # calls with more rows run the wide package
# A graph that pads its own attention rows (`rows_computed_alike`) runs calls of fewer than
# `EXACT_ROWS` rows as they come. Its padding branches on the row count, and `torch.export`
# guards the branch it traces, so its narrow package is traced below `EXACT_ROWS` and serves
# only calls of fewer rows; the wide one serves the rest.
ALIKE_NARROW_ROWS = 2
ALIKE_NARROW_MAX_ROWS = EXACT_ROWS - 1
SERVES_ROWS = "specc_narrow_max_rows"   # the package's metadata: the most query rows it serves
MIN_CHUNK_PER_THREAD = 16384     # elements per thread below which a kernel runs on one thread
WIDE_SUFFIX = ".wide.pt2"


class RowDispatch:
    """Calls the narrow package up to `max_rows` query rows, the wide one above (in bfloat16
    behind `PaddedRows` unless the graph computes rows alike, so calls of fewer rows arrive padded)."""

    def __init__(self, narrow, wide, input_index: int, axis: int, max_rows: int = NARROW_MAX_ROWS):
        self.narrow, self.wide = narrow, wide
        self.input_index, self.axis, self.max_rows = input_index, axis, max_rows

    def __call__(self, *args):
        rows = args[self.input_index].shape[self.axis]
        return (self.narrow if rows <= self.max_rows else self.wide)(*args)


def _load_package(path: Path, target: LoweringTarget):
    """On CUDA the package runs without its thread synchronisation, which CUDA graph capture
    (`specc.lower.cuda_graphs`) cannot record. On the CPU the weights a package copies out of
    itself as it loads are moved onto huge pages (`collapsed_pages`). A package built without
    its weights reads the graph's (`aoti_constants`). It is unpacked on disk where the temporary
    directory is in memory (`extraction_dir`)."""
    device = target.device
    with extraction_on_disk():
        if device.type == "cuda":
            package = torch._inductor.aoti_load_package(str(path), run_single_threaded=True,
                                                        device_index=device.index or 0)
        else:
            with new_memory_on_huge_pages():
                package = torch._inductor.aoti_load_package(str(path))
    if reads_graph_constants(package):
        hand_over_constants(package, target.module)
    return FlatCall.of(package)


class FlatCall:
    """A package whose inputs and outputs are flat tuples of tensors (as every specc graph's
    are), called without torch's per-call work: the package's own `__call__` parses its two
    tree specs from JSON and flattens and rebuilds its arguments on every call, which cost
    more than the step's argmax on a small model's decode step (~60 tensors: the KV caches)."""

    def __init__(self, package):
        self.package = package
        self._run = package.loader.boxed_run

    @classmethod
    def of(cls, package):
        """`package` wrapped when its call spec is flat, else as it is."""
        in_spec, out_spec = (pytree.treespec_loads(spec) for spec in package.loader.get_call_spec())
        flat_inputs = pytree.tree_structure((tuple(range(in_spec.num_leaves)), {}))
        flat_outputs = pytree.tree_structure(tuple(range(out_spec.num_leaves)))
        return cls(package) if (in_spec, out_spec) == (flat_inputs, flat_outputs) else package

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._run([arg for arg in args if isinstance(arg, torch.Tensor)]))

    def __getattr__(self, name: str):
        return getattr(self.package, name)


def _query_axis(target: LoweringTarget) -> tuple[int, int] | None:
    """(input index, axis) of the first input with a `q` axis; None: the graph has none."""
    axes = q_axes(target.signature.inputs)
    return axes[0] if axes else None


def _narrow_rows(target: LoweringTarget) -> tuple[int, int]:
    """(the query rows the narrow package is traced and tuned at, the most rows it serves)."""
    if target.dtype != torch.bfloat16:
        return NARROW_ROWS, NARROW_MAX_ROWS
    if _computes_rows_alike(target) and target.device.type == "cpu":   # where a wide package serves the rest
        return ALIKE_NARROW_ROWS, ALIKE_NARROW_MAX_ROWS
    return NARROW_ROWS_BF16, NARROW_MAX_ROWS


def _computes_rows_alike(target: LoweringTarget) -> bool:
    """Whether the engine runs the graph's calls unpadded (`specc.runtime.exactness.padded_rows`)."""
    return pads_itself(target.dtype, rows_computed_alike(target.module))


def _package(target: LoweringTarget, path: Path, rows: int, metadata: dict[str, str] | None = None) -> str:
    """Package the graph, without its weights where the package can read the graph's (`aoti_constants`)."""
    metadata = metadata or {}
    if may_read_graph_constants(target.module, target.device):
        _export_and_package(target, path, rows, {**metadata, CONSTANTS_KEY: FROM_GRAPH}, PACKAGED_WITHOUT_CONSTANTS)
        if reads_only_graph_constants(path, target.module, target.device):
            return path.name
    _export_and_package(target, path, rows, metadata, {})
    return path.name


def _export_and_package(target: LoweringTarget, path: Path, rows: int, metadata: dict[str, str],
                        extra_config: dict) -> None:
    example = example_inputs(target.signature, target.sizes, target.dtype, q=rows, kv=rows + 2, device=target.device)
    dynamic = dynamic_dims(target.signature, target.max_seq_len)
    config = {**packaging_config(target), **extra_config, "aot_inductor.metadata": metadata}
    try:
        with torch.no_grad(), torch_threads(idle_machine_threads()), templates_parsed_once(), \
                torch._inductor.config.patch(config), warnings.catch_warnings():
            # Inductor's own use of a deprecated torch API, which nobody compiling an engine can act on.
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
            exported = torch.export.export(target.module, tuple(example), dynamic_shapes=tuple(dynamic),
                                           strict=False, prefer_deferred_runtime_asserts_over_guards=True)
            torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    except Exception as exc:
        raise SpeccError(f"AOTInductor packaging of graph {target.name!r} ({rows}-row example) failed: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc


# Inductor writes each GEMM's autotuning table to stderr (dozens per graph on torch 2.11);
# specc's own progress says what packaging is doing.
QUIET_AUTOTUNING = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


def packaging_config(target: LoweringTarget) -> dict:
    """Inductor settings for a package: freezing always; on the CPU also GEMM autotuning
    between Inductor's own C++ micro-kernel template and ATen (oneDNN), which the C++
    template won for the decode-sized linears measured, and small kernels kept on one
    thread (see the module docstring); rounding as eager rounds, as under `inductor`; specc's
    operators called through their C shims."""
    config = {"freezing": True, **exact_rounding(target.device)}
    if target.device.type == "cpu":
        config.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                       "cpp.min_chunk_size": MIN_CHUNK_PER_THREAD, **QUIET_AUTOTUNING})
    config.update(c_shims.shim_config(target.module, target.device))
    return config


BACKEND = AOTInductorBackend()
