"""`aoti`: AOTInductor packages (`compiled/<graph>.pt2`) built at compile time.

Each graph is exported with its `q` and `kv` dimensions dynamic, from
example inputs built from its declared signature, and packaged; loading
needs no recompilation. Segments a method calls at run time (e.g. skippable
sublayers) cannot be packaged separately: they go through Inductor.

Packages are built with Inductor's freezing: the weights become constants
and, in float32, every linear layer runs oneDNN on a prepacked weight
(residual adds fused in). On SmolLM2-135M (one thread, AVX2) that made a
one-token step 0.77x and a four-token step 0.66x the time of the default
package, with logits within 2e-4 and the same argmax. In bfloat16 oneDNN
packs nothing on a CPU without AVX-512 BF16 or AMX, and the step time is
unchanged. The package holds one more copy of a tied LM head.

On the CPU each linear is also autotuned (`max_autotune`) between oneDNN and
Inductor's C++ GEMM template, at the example shape (a few query rows). On
SmolLM2 the template won every one (the LM head 3.7 ms against oneDNN's
9.4 ms, cache-hot), and a one-token step with 300 cached tokens took
22-26 ms against 34 ms with oneDNN alone; packaging took 162 s in all.

A kernel tuned at a few rows is slow for many: with the example at 3 query
rows, a 9-row forward of SmolLM2 took 3.0x a one-row step (ONNX Runtime:
1.6x), so verifying a 9-node tree cost three plain steps. Each graph is
therefore packaged twice: tuned at `NARROW_ROWS` query rows (decode steps and
short chains) and at `WIDE_ROWS` (trees, prompt chunks), and a call with more
than `NARROW_MAX_ROWS` rows runs the wide package. Measured on SmolLM2 (one
thread, 300 cached tokens; `benchmarks/verify_cost.py`): rows 1, 4, 6, 9, 12
took 22.9, 29.3, 49.5, 69.3, 87.2 ms tuned narrow and 36.4, 33.7, 37.0, 49.4,
55.5 ms tuned wide. The price: twice the packaging time, and the weights are
frozen into both packages (twice the memory and disk). In bfloat16 the narrow
package was first tuned at 2 rows with one-row calls run as two identical
rows: one row took 24.1 ms tuned at 3, 18.5 ms tuned at 2, and two rows
13.6 ms (float32: 21.5 ms). It is now tuned at `NARROW_ROWS_BF16` = 4 and
every call of fewer rows runs padded to 4 (`PaddedRows`), which makes
verifying up to 4 rows exact (`exact_rows`).

Inductor bakes the thread count into each GEMM kernel it generates (the
torch threads at packaging time; a kernel built for one thread never runs
in parallel). Packages are therefore built for `idle_machine_threads()`, the
physical cores `specc run` uses on an idle machine, whatever threads the
compile itself runs with (`--threads 1` to keep the machine usable while
training, say). A GEMM built for two threads still runs correctly on one.
Measured on SmolLM2 in bfloat16 (2 cores, 300 cached tokens, run with 2
threads): packaged for one thread, rows 1/3/4 took 13.3/14.8/16.6 ms; packaged
for two, 12.4/12.7/12.7 ms, so verifying four rows costs 1.02x a decode step
instead of 1.25x.

A decode step runs some 300 small kernels (norms, rotary embeddings, cache
writes, gates) besides the GEMMs, and Inductor splits any of them with more
than `min_chunk_size` (512) elements per thread over the OpenMP threads: a
fork and a join barrier for a few microseconds of work. libgomp took 15% of
a bfloat16 decode step's samples (`perf`, 2 threads), while the GEMMs
themselves read their weights at about the machine's sum bandwidth. Packages
for the CPU therefore keep kernels of fewer than `MIN_CHUNK_PER_THREAD`
elements per thread on one thread: on SmolLM2 in bfloat16 (2 threads, 300
cached tokens, interleaved) a decode step took 11.8 ms against 12.5 ms, and
131072 gave the same as 16384.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specc.errors import SpeccError, UsageError
from specc.graph.signature import dynamic_dims, example_inputs
from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.inductor import EXACT_ROUNDING, compile_dynamic
from specc.lower.row_padding import EXACT_ROWS, exact_in_reduced_precision, exact_rows_for, q_axes
from specc.host.threads import idle_machine_threads, torch_threads


class AOTInductorBackend(Backend):
    name = "aoti"
    help = "package each graph with AOTInductor at compile time (compiled/*.pt2); loads without recompiling"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})
    cuda_graphs = True
    ahead_of_time = True

    def package(self, target: LoweringTarget, artifacts: Path) -> list[str]:
        files = [_package(target, artifacts / f"{target.name}.pt2", _narrow_rows(target))]
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
        narrow = _load_package(package, target.device)
        wide, axis = artifacts / f"{target.name}{WIDE_SUFFIX}", _query_axis(target)
        if axis is not None and wide.is_file():   # engines packaged before the wide variant have none
            narrow = RowDispatch(narrow, _load_package(wide, target.device), *axis)
        return exact_in_reduced_precision(narrow, target)

    def exact_rows(self, dtype: torch.dtype) -> int | None:
        """In bfloat16 every call of up to `NARROW_ROWS_BF16` rows runs padded to exactly that
        many (`PaddedRows`), so a verification of that many rows runs the very kernels of a
        decode step, row for row. Unpadded, the row count changed the rounding: on SmolLM2
        (real text, prefixes 100-250) a 4-row call's first row differed from a decode
        step's at 107 of 150 prefixes, by up to 0.6 in the logits, enough to flip bfloat16
        near-ties; padded to 4 rows, every row matched except where the call's rows
        straddled a key block (`specc.runtime.masks.rows_in_key_block`, which the loop
        respects). In float32 the differences stay below what flips greedy choices in
        every test here."""
        return exact_rows_for(dtype)

    def lower_segment(self, segment):
        return compile_dynamic(segment)


NARROW_ROWS, WIDE_ROWS = 3, 12   # query rows of the example each package is tuned at
NARROW_ROWS_BF16 = EXACT_ROWS      # and every bfloat16 call of fewer rows runs padded to this many
NARROW_MAX_ROWS = 4               # calls with more rows run the wide package
MIN_CHUNK_PER_THREAD = 16384     # elements per thread below which a kernel runs on one thread
WIDE_SUFFIX = ".wide.pt2"


class RowDispatch:
    """Calls the narrow package up to `NARROW_MAX_ROWS` query rows, the wide one above
    (in bfloat16 behind `PaddedRows`, so calls of fewer rows arrive padded)."""

    def __init__(self, narrow, wide, input_index: int, axis: int):
        self.narrow, self.wide = narrow, wide
        self.input_index, self.axis = input_index, axis

    def __call__(self, *args):
        rows = args[self.input_index].shape[self.axis]
        return (self.narrow if rows <= NARROW_MAX_ROWS else self.wide)(*args)


def _load_package(path: Path, device: torch.device):
    """On CUDA the package runs without its thread synchronisation, which CUDA graph capture
    (`specc.lower.cuda_graphs`) cannot record."""
    if device.type == "cuda":
        return torch._inductor.aoti_load_package(str(path), run_single_threaded=True, device_index=device.index or 0)
    return torch._inductor.aoti_load_package(str(path))


def _query_axis(target: LoweringTarget) -> tuple[int, int] | None:
    """(input index, axis) of the first input with a `q` axis; None: the graph has none."""
    axes = q_axes(target.signature.inputs)
    return axes[0] if axes else None


def _narrow_rows(target: LoweringTarget) -> int:
    return NARROW_ROWS_BF16 if target.dtype == torch.bfloat16 else NARROW_ROWS


def _package(target: LoweringTarget, path: Path, rows: int) -> str:
    example = example_inputs(target.signature, target.sizes, target.dtype, q=rows, kv=rows + 2, device=target.device)
    dynamic = dynamic_dims(target.signature, target.max_seq_len)
    try:
        with torch.no_grad(), torch_threads(idle_machine_threads()), \
                torch._inductor.config.patch(packaging_config(target)):
            exported = torch.export.export(target.module, tuple(example), dynamic_shapes=tuple(dynamic),
                                           strict=False, prefer_deferred_runtime_asserts_over_guards=True)
            torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    except Exception as exc:
        raise SpeccError(f"AOTInductor packaging of graph {target.name!r} ({rows}-row example) failed: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    return path.name


def packaging_config(target: LoweringTarget) -> dict:
    """Inductor settings for a package: freezing always; on the CPU also GEMM autotuning
    between Inductor's own C++ micro-kernel template and ATen (oneDNN), which the C++
    template wins for every decode-sized linear of SmolLM2, and small kernels kept on one
    thread (see the module docstring); rounding as eager rounds, as under `inductor`."""
    config = {"freezing": True, **EXACT_ROUNDING}
    if target.device.type == "cpu":
        config.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                       "cpp.min_chunk_size": MIN_CHUNK_PER_THREAD})
    return config


BACKEND = AOTInductorBackend()
