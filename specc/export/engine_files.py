"""An engine read for export: its verified manifest and its weight files, no graph rebuilt.

Export reads tensors by name, so it needs neither the serialized graphs nor a
backend: `read_verified_manifest` checks the format and every file's sha256, and
the target's safetensors file is opened lazily (a full-vocabulary head reads one
tensor of it, not the whole model). A tensor is looked up in
`weights/added.safetensors` (what the method trained) and then in the target's
file, where the engine writer keeps every other parameter its graphs read
(parameters a pass added but training left alone, tied tensors stored once and
aliased).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from specc.contract.descriptor import TARGET
from specc.engine.save import ADDED_WEIGHTS
from specc.engine.verify import read_verified_manifest
from specc.errors import SpeccError



@dataclass
class EngineFiles:
    path: Path
    manifest: dict
    _added: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: Path) -> "EngineFiles":
        return cls(path, read_verified_manifest(path))

    @property
    def method(self) -> str:
        return self.manifest.get("method", "?")

    @property
    def method_state(self) -> dict:
        return self.manifest.get("method_state") or {}

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.manifest["dtype"])

    def target_architecture(self) -> dict:
        """The `ArchitectureSummary` (as JSON) of the target model, from its first graph."""
        return self._target_graph()["architecture"]

    def names(self) -> set[str]:
        """Every tensor name the engine stores, trained or not (aliases included)."""
        with safe_open(str(self._target_file()), framework="pt") as handle:
            stored = set(handle.keys())
        return set(self._added_tensors()) | stored | set(self._aliases())

    def tensor(self, name: str) -> torch.Tensor | None:
        """The tensor `name` (the trained copy when the method trained it), or None."""
        added = self._added_tensors()
        if name in added:
            return added[name]
        stored = self._aliases().get(name, name)
        with safe_open(str(self._target_file()), framework="pt") as handle:
            return handle.get_tensor(stored) if stored in handle.keys() else None

    def _added_tensors(self) -> dict[str, torch.Tensor]:
        if self._added is None:
            present = ADDED_WEIGHTS in self.manifest["files"]
            self._added = load_file(str(self.path / ADDED_WEIGHTS)) if present else {}
        return self._added

    def _aliases(self) -> dict[str, str]:
        return self.manifest.get("weight_aliases", {}).get(TARGET, {})

    def _target_file(self) -> Path:
        return self.path / self._target_graph()["weights"]

    def _target_graph(self) -> dict:
        for entry in self.manifest.get("graphs", {}).values():
            if entry.get("source") == TARGET:
                return entry
        raise SpeccError(f"{self.path}: the manifest lists no graph of the target model; the engine is "
                         f"damaged, recompile it")
