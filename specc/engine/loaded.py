"""Load a verified engine and generate with it."""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path
import torch
from safetensors.torch import load_file

from specc.capture.families import ArchitectureSummary
from specc.capture.load import load_tokenizer
from specc.contract.descriptor import check_backend, get_method
from specc.contract.sampling import SamplingConfig
from specc.engine.aligned_weights import ALIGNMENT
from specc.engine.composition import engine_runtime, with_load_time_settings
from specc.engine.method_config import read_method_config
from specc.engine.weight_pages import weights_on_huge_pages
from specc.engine.save import ADDED_WEIGHTS
from specc.engine.verify import read_verified_manifest
from specc.errors import UsageError
from specc.graph.serialize import attributes_streamed, graph_from_json
from specc.graph.signature import GraphSignature, static_sizes
from specc.host.device import device_kind, does_not_fit, move_graph, resolve_device
from specc.lower.backend import RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.cuda_graphs import ROW_BUCKETS, CudaGraphs
from specc.lower.registry import get_backend
from specc.lower.row_padding import exact_calls
from specc.runtime.context import MethodContext
from specc.runtime.exactness import max_draft_nodes
from specc.runtime.generate import GenerationResult, generate, stream
from specc.runtime.prefix_reuse import PrefixReuse, resumable
from specc.runtime.warm_up import warm_up

UNLIMITED_TOKENIZER_LENGTH = int(1e30)   # transformers' own 'no limit' (VERY_LARGE_INTEGER)


def _tensor_kind_of_the_warm_up(backend: Backend):
    """Where the runtime's KV caches and method buffers are made. A lazily compiling backend's
    guards check whether each graph input is an inference tensor, and its warm-up and every
    decoding call run under inference mode (`runtime.generate`): buffers made outside it made
    Inductor compile every graph again on the first real call, and again where a method passes
    a view of such a buffer where it elsewhere passes a fresh tensor (benchmarks/NOTES.md, "The
    second GPU check"). Other backends keep normal tensors, which callers may also write
    outside inference mode."""
    return torch.inference_mode() if backend.compiles_lazily else contextlib.nullcontext()


class LoadedEngine:
    def __init__(self, path: Path, manifest: dict, backend: Backend, device: torch.device = torch.device("cpu"),
                 settings: list[str] = ()):
        self.path = path
        self.manifest = manifest
        self.backend = backend
        self.device = device
        self.max_seq_len = int(manifest["max_seq_len"])
        self.dtype = getattr(torch, manifest["dtype"])
        self.method = get_method(manifest["method"])
        check_backend(self.method, backend)
        self.config = with_load_time_settings(read_method_config(self.method, manifest, path), self.method.name,
                                              list(settings))
        start = time.perf_counter()
        try:
            targets = _lowering_targets(path, manifest, self.dtype, self.max_seq_len, device, backend)
            whole = {name: t for name, t in targets.items() if manifest["graphs"][name].get("lowered", True)}
            graphs = {name: exact_calls(backend.load(target, path / "compiled", manifest), target,
                                        backend.row_exactness) for name, target in whole.items()}
            if backend.compiles_lazily:
                for name, target in whole.items():
                    warm_up(graphs[name], target)
            self.cuda_graphs = _replayed_from_cuda_graphs(graphs, whole, backend, device)
            graphs |= {name: target.module for name, target in targets.items() if name not in whole}
        except torch.OutOfMemoryError as exc:
            raise does_not_fit(exc, f"the engine ({manifest['dtype']}, --max-seq-len {self.max_seq_len}) "
                                    f"on {device}") from None
        self.context = MethodContext(
            graphs=graphs, modules={name: t.module for name, t in targets.items()},
            signatures={name: t.signature for name, t in targets.items()},
            architectures={name: self.architecture(name) for name in targets},
            state=manifest.get("method_state", {}), max_seq_len=self.max_seq_len, dtype=self.dtype,
            lower_segment=backend.lower_segment, compiles_lazily=backend.compiles_lazily, device=device,
            # A lossless engine's calls hold no more rows than the backend computes exactly as a decode step.
            exact_rows=backend.exact_rows(self.dtype) if manifest.get("lossless") else None)
        self._build_runtime()
        self.compile_seconds = time.perf_counter() - start if backend.compiles_lazily else 0.0
        self._tokenizer = None

    def _build_runtime(self) -> None:
        """The method's runtime over the loaded graphs, with KV caches of its own."""
        try:
            with _tensor_kind_of_the_warm_up(self.backend):
                self.runtime = engine_runtime(self.method, self.context, self.config)
        except torch.OutOfMemoryError as exc:
            raise does_not_fit(exc, f"the KV caches (--max-seq-len {self.max_seq_len}) on {self.device}") from None
        self.reuses_prefixes = resumable(self.runtime.target, self.runtime.drafter)
        self.max_draft_rows = max_draft_nodes(self.method, self.config, self.context.exact_rows)
        self._prefix = PrefixReuse()

    def with_settings(self, settings: list[str]) -> "LoadedEngine":
        """This engine with load-time `settings` (`key=value`) applied to its manifest's config:
        the same graphs and weights (nothing loads or compiles again), a runtime and KV caches
        of its own, so the two may take turns generating (a benchmark comparing settings)."""
        variant = copy.copy(self)
        variant.config = with_load_time_settings(read_method_config(self.method, self.manifest, self.path),
                                                 self.method.name, list(settings))
        variant._build_runtime()
        return variant

    @property
    def drafter(self):
        return self.runtime.drafter

    @property
    def target(self):
        return self.runtime.target

    @property
    def method_state(self) -> dict:
        """JSON state the method's compile-time step stored in the manifest (may be empty)."""
        return self.context.state

    def architecture(self, name: str) -> ArchitectureSummary:
        return ArchitectureSummary.from_json(self.manifest["graphs"][name]["architecture"])

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path / "tokenizer")
            # The engine checks every prompt against its own max_seq_len and says so in specc's
            # words; the checkpoint's limit (often 512 on small models) would only add transformers'
            # raw "Token indices sequence length ... (549 > 512)" warning beside that message.
            self._tokenizer.model_max_length = UNLIMITED_TOKENIZER_LENGTH
        return self._tokenizer

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int,
                     sampling: SamplingConfig = SamplingConfig(), on_tokens=None,
                     reuse_prefix: bool = False) -> GenerationResult:
        """`reuse_prefix`: prefill only what the previous generation's cache does not already
        hold (`specc.runtime.prefix_reuse`; engines whose method cannot resume prefill whole)."""
        reused = self._reusable(prompt_ids, reuse_prefix)
        with self.generation_scope():
            result = generate(self.runtime.target, self.runtime.drafter, prompt_ids, max_new_tokens, sampling,
                              self.max_seq_len, on_tokens=on_tokens, max_rows=self.max_draft_rows, reused=reused)
        self._keep(prompt_ids, result)
        return result

    def rounds(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
               reuse_prefix: bool = False):
        """The decoding loop as a generator (`specc.runtime.generate.stream`: send, yield
        each round's tokens, return the result). Each round runs under the backend's
        generation scope; the caller's code between rounds runs outside it.
        `reuse_prefix` as for `generate_ids`."""
        reused = self._reusable(prompt_ids, reuse_prefix)
        steps = stream(self.runtime.target, self.runtime.drafter, prompt_ids, max_new_tokens, sampling,
                       self.max_seq_len, self.max_draft_rows, reused)
        result = yield from _each_step_in(self.generation_scope, steps)
        self._keep(prompt_ids, result)
        return result

    def _reusable(self, prompt_ids: list[int], reuse_prefix: bool) -> int:
        """Prompt tokens the cache already holds, and forgets them: the generation about to
        start overwrites the cache, and only one that finishes says what it holds."""
        reused = self._prefix.usable(prompt_ids, self.runtime.target) if reuse_prefix and self.reuses_prefixes else 0
        self._prefix.forget()
        return reused

    def _keep(self, prompt_ids: list[int], result: GenerationResult) -> None:
        if self.reuses_prefixes:
            self._prefix.keep(prompt_ids, result.token_ids, self.runtime.target)

    def generation_scope(self):
        """The backend's thread settings while this engine generates (timing its graphs directly too)."""
        runs_segments = self.runtime.runs_segments
        if runs_segments is None:
            runs_segments = RUN_TIME_SEGMENTS in self.method.requires
        return self.backend.generation_scope(runs_segments)

    def encode(self, prompt: str) -> list[int]:
        if not prompt:
            raise UsageError("the prompt is empty; pass some text with --prompt")
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]


def load_engine(path: str | Path, backend: str | None = None, device: str | None = None,
                settings: list[str] = ()) -> LoadedEngine:
    """The engine at `path`, lowered with `backend` (default: the one it was compiled for) on
    `device` (default `auto`: a CUDA device when present, else the CPU), with `settings`
    (`key=value`, fields the method's config marks `at_load`) changed from its manifest's."""
    path = Path(path)
    manifest = read_verified_manifest(path)
    backend = get_backend(backend or manifest["backend"])
    resolved = resolve_device(manifest.get("device", "cpu") if _keeps_built_device(backend, manifest, device)
                              else device)
    check_engine_device(manifest, backend, resolved)
    return LoadedEngine(path, manifest, backend, resolved, settings)


def _keeps_built_device(backend: Backend, manifest: dict, device: str | None) -> bool:
    """`auto` loads ahead-of-time packages on the kind of device they were built for."""
    return (device in (None, "auto") and backend.ahead_of_time and backend.name == manifest["backend"])


def check_engine_device(manifest: dict, backend: Backend, device: torch.device) -> None:
    """Ahead-of-time artifacts run only on the kind of device they were built for."""
    built_for = manifest.get("device", "cpu")
    if backend.ahead_of_time and backend.name == manifest["backend"] and built_for != device_kind(device):
        raise UsageError(f"this {backend.name} engine was compiled for {built_for}, and its packages run only "
                         f"there; load it with --device {built_for}, or recompile it with --device "
                         f"{device_kind(device)}")


def _replayed_from_cuda_graphs(graphs: dict, targets: dict, backend: Backend, device: torch.device) -> dict:
    """On CUDA, each graph of a backend that runs in torch replays CUDA graphs (`CudaGraphs`);
    returns them by name (empty on the CPU)."""
    if device.type != "cuda" or not backend.cuda_graphs:
        return {}
    pool = torch.cuda.graph_pool_handle()
    replayed = {}
    for name, target in targets.items():
        exact = backend.exact_rows(target.dtype) or 1
        buckets = tuple(b for b in ROW_BUCKETS if b >= exact)
        replayed[name] = graphs[name] = CudaGraphs(graphs[name], target.signature, pool, buckets)
    return replayed


def _lowering_targets(path: Path, manifest: dict, dtype: torch.dtype, max_seq_len: int,
                      device: torch.device, backend: Backend) -> dict[str, LoweringTarget]:
    modules = _load_graphs(path, manifest, device, backend.runs_graph_weights)
    targets = {}
    for name, module in modules.items():
        entry = manifest["graphs"][name]
        architecture = ArchitectureSummary.from_json(entry["architecture"])
        targets[name] = LoweringTarget(name, module, GraphSignature.from_json(entry["signature"]),
                                       static_sizes(architecture, max_seq_len), dtype, max_seq_len, device)
    return targets


def _load_graphs(path: Path, manifest: dict, device: torch.device, runs_graph_weights: bool) -> dict:
    """`runs_graph_weights`: the backend streams the graphs' own float weights, so those are read
    onto huge pages too (`weight_pages`)."""
    graph_jsons = {name: json.loads((path / "graphs" / f"{name}.json").read_text()) for name in manifest["graphs"]}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    # Parameters a method trained are stored once, beside the source weights they extend.
    added = load_file(str(path / ADDED_WEIGHTS), device=str(device)) if ADDED_WEIGHTS in manifest["files"] else {}
    modules = {}
    for name, entry in manifest["graphs"].items():
        source = entry["source"]
        if source not in weights:
            aliases = manifest.get("weight_aliases", {}).get(source, {})
            streamed = _streamed_by(graph_jsons, manifest, source, aliases) if runs_graph_weights else set()
            file = path / entry["weights"]
            tensors = weights_on_huge_pages(file, aligned_packed_weights(load_file(str(file), device=str(device))),
                                            floats=streamed)
            for alias, original in aliases.items():
                tensors[alias] = tensors[original]
            weights[source] = tensors | added
        modules[name] = move_graph(graph_from_json(graph_jsons[name], weights[source]), device)
    return modules


def _streamed_by(graph_jsons: dict[str, dict], manifest: dict, source: str, aliases: dict[str, str]) -> set[str]:
    """The weights of `source` that some graph reading them reads whole, by their names in its file."""
    names = set().union(*(attributes_streamed(graph_jsons[name]) for name, entry in manifest["graphs"].items()
                          if entry["source"] == source))
    return {aliases.get(name, name) for name in names}


def aligned_packed_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with every integer tensor (a `--quantize` engine's packed weights) at an aligned
    address: a file not written aligned (`aligned_weights`; engines before 2026-12-01) places a
    tensor at any byte offset, and the CPU int8 matmul kernel crashes (SIGSEGV) on an int8
    weight that is not aligned, where it computes on a copy."""
    return {name: t.clone() if not t.is_floating_point() and t.data_ptr() % ALIGNMENT else t
            for name, t in tensors.items()}


def _each_step_in(scope, steps):
    """Drive the generator `steps`, entering `scope()` around each of its steps only."""
    try:
        sent = None
        while True:
            with scope():
                try:
                    emitted = steps.send(sent)
                except StopIteration as done:
                    return done.value
            sent = yield emitted
    finally:
        steps.close()
