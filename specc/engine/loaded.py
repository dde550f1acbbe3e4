"""Load a verified engine and generate with it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from specc.capture.families import ArchitectureSummary
from specc.capture.load import load_tokenizer
from specc.engine.format import BACKENDS
from specc.engine.save import ADDED_WEIGHTS
from specc.engine.verify import read_verified_manifest
from specc.errors import SpeccError, UsageError
from specc.graph.serialize import graph_from_json
from specc.lower.backends import load_aoti, lower_eager, lower_inductor
from specc.methods.descriptor import get_method
from specc.methods.infrastructure import DECODING_INPUTS
from specc.passes.insert_kv_cache import cache_input_names
from specc.runtime.cached_model import CachedModel
from specc.runtime.generate import GenerationResult, generate
from specc.runtime.sampling import SamplingConfig



class LoadedEngine:
    def __init__(self, path: Path, manifest: dict, backend: str):
        self.path = path
        self.manifest = manifest
        self.backend = backend
        self.max_seq_len = int(manifest["max_seq_len"])
        self.dtype = getattr(torch, manifest["dtype"])
        self.method = get_method(manifest["method"])
        self.config = self.method.config_class.from_json(manifest["method_config"])
        self.graph_modules = _load_graphs(path, manifest)
        self.forward_fns = {name: self._lower(name, gm) for name, gm in self.graph_modules.items()}
        self._cached: dict[str, CachedModel] = {}
        start = time.perf_counter()
        if backend == "inductor":
            self._warm_up()
        # A method warms up, in make_drafter, the graphs only it knows how to call.
        self.drafter = self.method.make_drafter(self, self.config)
        self.compile_seconds = time.perf_counter() - start if backend == "inductor" else 0.0
        self._tokenizer = None

    @property
    def method_state(self) -> dict:
        """JSON state the method's compile-time step stored in the manifest (may be empty)."""
        return self.manifest.get("method_state", {})

    def architecture(self, name: str) -> ArchitectureSummary:
        return ArchitectureSummary.from_json(self.manifest["graphs"][name]["architecture"])

    def cached_model(self, name: str) -> CachedModel:
        """The graph `name` with its own KV cache, created once per engine."""
        if name not in self._cached:
            if name not in self.forward_fns:
                raise SpeccError(f"engine has no graph {name!r}; it has {', '.join(self.forward_fns)}")
            self._cached[name] = CachedModel(self.forward_fns[name], self.architecture(name),
                                             self.max_seq_len, self.dtype)
        return self._cached[name]

    def register_model(self, name: str, model: CachedModel) -> None:
        """Install a runtime model the method composed from several graphs (Kangaroo's
        target runs `shallow` only where no exit state is stored, then `deep`);
        `cached_model(name)` returns it from then on."""
        if name in self._cached:
            raise SpeccError(f"engine already has a runtime model {name!r}")
        self._cached[name] = model

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.path / "tokenizer")
        return self._tokenizer

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int,
                     sampling: SamplingConfig = SamplingConfig()) -> GenerationResult:
        target = self.cached_model("target")
        return generate(target, self.drafter, prompt_ids, max_new_tokens, sampling, self.max_seq_len)

    def encode(self, prompt: str) -> list[int]:
        if not prompt:
            raise UsageError("the prompt is empty; pass some text with --prompt")
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def _lower(self, name: str, gm):
        if self.backend == "eager":
            return lower_eager(gm)
        if self.backend == "inductor":
            return lower_inductor(gm)
        package = self.path / "compiled" / f"{name}.pt2"
        if not package.is_file():
            raise UsageError(f"engine {self.path} has no AOTInductor package for {name!r}; "
                             f"it was compiled for backend {self.manifest['backend']!r}")
        if self.manifest["versions"]["torch"] != torch.__version__:
            raise SpeccError(f"AOTInductor packages were built with torch {self.manifest['versions']['torch']}, "
                             f"this is torch {torch.__version__}; recompile the engine")
        return load_aoti(package)

    def _warm_up(self) -> None:
        """Trigger Inductor's compilations (prefill and single-token shapes) once, for
        every graph that takes the plain decoding inputs."""
        with torch.inference_mode():
            for name in self.forward_fns:
                if not self._takes_decoding_inputs(name):
                    continue
                model = self.cached_model(name)
                chunk, start, step_at = _warm_up_shapes(self.max_seq_len)
                model.extend(torch.zeros(chunk, dtype=torch.long), start)
                model.extend(torch.zeros(1, dtype=torch.long), step_at)
                model.forward_passes = 0

    def _takes_decoding_inputs(self, name: str) -> bool:
        """Inputs exactly `input_ids, position_ids, attn_mask, cache_positions` and the
        k/v cache of each layer (no method-specific inputs such as exit states)."""
        layers = self.architecture(name).num_layers
        caches = [cache for layer in range(layers) for cache in cache_input_names(layer)]
        return self.manifest["graphs"][name]["inputs"] == [*DECODING_INPUTS, *caches]


def _warm_up_shapes(max_seq_len: int) -> tuple[int, int, int]:
    """(chunk length, chunk start, single-token slot) for the warm-up calls.

    The chunk must not start at 0: Inductor would see q == kv_len and
    specialize on that equality, recompiling at the first tree or step.
    Odd primes avoid coinciding with model dimensions for the same reason.
    """
    if max_seq_len >= 20:
        return 7, 6, 18
    return 3, 2, 5


def load_engine(path: str | Path, backend: str | None = None) -> LoadedEngine:
    path = Path(path)
    manifest = read_verified_manifest(path)
    backend = backend or manifest["backend"]
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    return LoadedEngine(path, manifest, backend)


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
