"""Refuse engines that are tampered with, incomplete, or from a newer specc."""

from __future__ import annotations

import json
from pathlib import Path

from specc.engine.format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, sha256_file
from specc.errors import SpeccError, UsageError
from specc.kernels.registry import KERNELS


def read_verified_manifest(engine_dir: Path) -> dict:
    if not engine_dir.exists():
        raise UsageError(f"engine directory {engine_dir} does not exist; create one with "
                         f"`specc compile MODEL --method METHOD -o {engine_dir}`")
    if not engine_dir.is_dir():
        raise UsageError(f"{engine_dir} is a file, not an engine; pass the directory `specc compile -o DIR` wrote")
    manifest_path = engine_dir / MANIFEST
    if not manifest_path.is_file():
        if (engine_dir / "config.json").is_file():
            raise UsageError(f"{engine_dir} is a model checkpoint, not an engine; compile it first: "
                             f"specc compile {engine_dir} --method none -o ENGINE_DIR")
        raise UsageError(f"{engine_dir} is not a specc engine (it has no {MANIFEST}); pass a directory "
                         f"written by `specc compile -o DIR`")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise SpeccError(f"{manifest_path} is not valid JSON ({exc}); the engine is damaged, recompile it") from None
    _check_format(manifest, engine_dir)
    _check_kernel_revisions(manifest, engine_dir)
    _check_files(manifest.get("files", {}), engine_dir)
    return manifest


def _check_format(manifest: dict, engine_dir: Path) -> None:
    if manifest.get("format") != FORMAT_NAME:
        raise SpeccError(f"{engine_dir} is not a specc engine (format {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise SpeccError(f"{engine_dir}: manifest has no integer format_version; recompile the engine")
    if version > FORMAT_VERSION:
        raise SpeccError(
            f"{engine_dir} uses engine format {version}, newer than this specc reads ({FORMAT_VERSION}); "
            f"upgrade specc"
        )
    if version < FORMAT_VERSION:
        raise SpeccError(f"{engine_dir} uses old engine format {version}; recompile it with this specc")


def _check_kernel_revisions(manifest: dict, engine_dir: Path) -> None:
    """Each specc kernel the engine's graphs call must be the revision they were compiled against
    (engines from before revisions were recorded were compiled against revision 1)."""
    recorded = manifest.get("kernel_revisions", {})
    for name in sorted({name for names in manifest.get("kernels", {}).values() for name in names}):
        kernel = KERNELS.get(name)
        if kernel is None:
            raise SpeccError(f"{engine_dir} calls the specc kernel {name!r}, which this specc does not have; "
                             f"recompile the engine with this specc")
        revision = recorded.get(name, 1)
        if revision != kernel.revision:
            raise SpeccError(f"{engine_dir} was compiled against revision {revision} of the specc kernel {name!r}; "
                             f"this specc has revision {kernel.revision} ({kernel.revised}); recompile the engine")


def _check_files(files: dict[str, str], engine_dir: Path) -> None:
    if not files:
        raise SpeccError(f"{engine_dir}: manifest lists no files; the engine is incomplete, recompile it")
    for relative, expected in files.items():
        path = engine_dir / relative
        if ".." in Path(relative).parts or not path.is_file():
            raise SpeccError(f"{engine_dir} is incomplete: {relative} is missing; recompile the engine")
        if sha256_file(path) != expected:
            raise SpeccError(
                f"{engine_dir}: checksum mismatch for {relative}; the engine was modified after compiling, "
                f"recompile it"
            )
