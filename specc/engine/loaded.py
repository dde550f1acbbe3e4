"""Load a verified engine and generate with it."""

from __future__ import annotations

import json
import time
from pathlib import Path
import torch
from safetensors.torch import load_file

from specc.capture.families import ArchitectureSummary
from specc.capture.load import load_tokenizer
from specc.engine.save import ADDED_WEIGHTS
from specc.engine.verify import read_verified_manifest
from specc.errors import UsageError
from specc.graph.serialize import graph_from_json
from specc.graph.signature import GraphSignature, static_sizes
from specc.lower.backend import RUN_TIME_SEGMENTS, Backend, LoweringTarget
from specc.lower.registry import get_backend
from specc.methods.descriptor import check_backend, get_method
from specc.runtime.context import MethodContext
from specc.runtime.generate import GenerationResult, generate, stream
from specc.runtime.sampling import SamplingConfig
from specc.runtime.warm_up import warm_up


class LoadedEngine:
    def __init__(self, path: Path, manifest: dict, backend: Backend):
        self.path = path
        self.manifest = manifest
        self.backend = backend
        self.max_seq_len = int(manifest["max_seq_len"])
        self.dtype = getattr(torch, manifest["dtype"])
        self.method = get_method(manifest["method"])
        check_backend(self.method, backend)
        self.config = self.method.config_class.from_json(manifest["method_config"])
        start = time.perf_counter()
        targets = _lowering_targets(path, manifest, self.dtype, self.max_seq_len)
        graphs = {name: backend.load(target, path / "compiled", manifest) for name, target in targets.items()}
        if backend.compiles_lazily:
            for name, target in targets.items():
                warm_up(graphs[name], target)
        self.context = MethodContext(
            graphs=graphs, modules={name: t.module for name, t in targets.items()},
            signatures={name: t.signature for name, t in targets.items()},
            architectures={name: self.architecture(name) for name in targets},
            state=manifest.get("method_state", {}), max_seq_len=self.max_seq_len, dtype=self.dtype,
            lower_segment=backend.lower_segment, compiles_lazily=backend.compiles_lazily)
        self.runtime = self.method.build_runtime(self.context, self.config)
        self.compile_seconds = time.perf_counter() - start if backend.compiles_lazily else 0.0
        # A lossless engine drafts no more rows than the backend computes exactly as a decode step.
        self.max_draft_rows = backend.exact_rows(self.dtype) if manifest.get("lossless") else None
        self._tokenizer = None

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
        return self._tokenizer

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int,
                     sampling: SamplingConfig = SamplingConfig(), on_tokens=None) -> GenerationResult:
        with self.generation_scope():
            return generate(self.runtime.target, self.runtime.drafter, prompt_ids, max_new_tokens, sampling,
                            self.max_seq_len, on_tokens=on_tokens, max_rows=self.max_draft_rows)

    def rounds(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingConfig = SamplingConfig()):
        """The decoding loop as a generator (`specc.runtime.generate.stream`: send, yield
        each round's tokens, return the result). Each round runs under the backend's
        generation scope; the caller's code between rounds runs outside it."""
        steps = stream(self.runtime.target, self.runtime.drafter, prompt_ids, max_new_tokens, sampling,
                       self.max_seq_len, self.max_draft_rows)
        return (yield from _each_step_in(self.generation_scope, steps))

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


def load_engine(path: str | Path, backend: str | None = None) -> LoadedEngine:
    path = Path(path)
    manifest = read_verified_manifest(path)
    return LoadedEngine(path, manifest, get_backend(backend or manifest["backend"]))


def _lowering_targets(path: Path, manifest: dict, dtype: torch.dtype, max_seq_len: int) -> dict[str, LoweringTarget]:
    modules = _load_graphs(path, manifest)
    targets = {}
    for name, module in modules.items():
        entry = manifest["graphs"][name]
        architecture = ArchitectureSummary.from_json(entry["architecture"])
        targets[name] = LoweringTarget(name, module, GraphSignature.from_json(entry["signature"]),
                                       static_sizes(architecture, max_seq_len), dtype, max_seq_len)
    return targets


def _load_graphs(path: Path, manifest: dict) -> dict:
    weights: dict[str, dict[str, torch.Tensor]] = {}
    # Parameters a method trained are stored once, beside the source weights they extend.
    added = load_file(str(path / ADDED_WEIGHTS)) if ADDED_WEIGHTS in manifest["files"] else {}
    modules = {}
    for name, entry in manifest["graphs"].items():
        source = entry["source"]
        if source not in weights:
            tensors = load_file(str(path / entry["weights"]))
            for alias, original in manifest.get("weight_aliases", {}).get(source, {}).items():
                tensors[alias] = tensors[original]
            weights[source] = tensors | added
        graph_json = json.loads((path / "graphs" / f"{name}.json").read_text())
        modules[name] = graph_from_json(graph_json, weights[source])
    return modules


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
