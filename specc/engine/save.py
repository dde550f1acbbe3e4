"""Write an engine directory atomically: build it beside the target, then rename."""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from specc import __version__
from specc.engine.aligned_weights import save_aligned
from specc.engine.format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, checksums, ir_file_name
from specc.errors import UsageError
from specc.graph.serialize import graph_attributes, graph_to_json
from specc.graph.signature import read_signature
from specc.contract.program import SpeculativeProgram

ADDED_WEIGHTS = "weights/added.safetensors"   # relative to the engine directory


def check_output_dir(output: Path, force: bool) -> None:
    if output.exists() and not force:
        raise UsageError(f"output directory {output} already exists; pass --force to replace it")
    if output.exists() and not output.is_dir():
        raise UsageError(f"output path {output} exists and is not a directory")
    if output.parent.exists() and not output.parent.is_dir():
        raise UsageError(f"{output.parent} is a file, so {output} cannot be created inside it")


@contextmanager
def staging_dir(output: Path, force: bool):
    """Yield a temporary directory that replaces `output` only on success."""
    check_output_dir(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(output)
    staging = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        apply_umask(staging)
        _replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_stale_staging(output: Path) -> list[Path]:
    """Remove `.NAME.partial-PID` / `.NAME.old-PID` left beside `output` by processes that
    no longer run (killed with SIGKILL, or a power cut); returns what was removed."""
    removed = []
    for kind in ("partial", "old"):
        for path in output.parent.glob(f".{output.name}.{kind}-*"):
            pid = path.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def apply_umask(root: Path) -> None:
    """Give every file and directory under `root` the modes the user's umask allows
    (some writers, safetensors among them, create files 0600 whatever the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _replace(staging: Path, output: Path) -> None:
    if output.exists():
        trash = output.parent / f".{output.name}.old-{os.getpid()}"
        os.replace(output, trash)
        os.replace(staging, output)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, output)


def write_program(staging: Path, program: SpeculativeProgram, tokenizer) -> dict:
    """Write graphs, weights, IR dumps and tokenizer; return the manifest's graph table."""
    tokenizer.save_pretrained(staging / "tokenizer")
    (staging / "graphs").mkdir()
    (staging / "weights").mkdir()
    aliases = _write_weights(staging / "weights", program)
    graphs = {}
    for name, graph in program.graphs.items():
        (staging / "graphs" / f"{name}.json").write_text(json.dumps(graph_to_json(graph.module)))
        graphs[name] = {
            "source": graph.source,
            "weights": f"weights/{graph.source}.safetensors",
            "architecture": graph.architecture.to_json(),
            "inputs": [n.target for n in graph.module.graph.nodes if n.op == "placeholder"],
            "signature": read_signature(graph.module).to_json(),
            **({} if graph.lowered else {"lowered": False}),
        }
    _write_ir(staging / "ir", program)
    return {"graphs": graphs, "weight_aliases": aliases}


def _write_weights(directory: Path, program: SpeculativeProgram) -> dict[str, dict[str, str]]:
    """One safetensors file per source model; tied tensors stored once, aliased.
    Parameters the method added (and graphs read) go only to `added.safetensors`."""
    by_source: dict[str, dict[str, torch.Tensor]] = {}
    for graph in program.graphs.values():
        attributes = graph_attributes(graph.module)
        by_source.setdefault(graph.source, {}).update(
            {name: t for name, t in attributes.items() if name not in program.added_weights})
    aliases: dict[str, dict[str, str]] = {}
    for source, tensors in by_source.items():
        unique, source_aliases = _dedupe(tensors)
        save_aligned(unique, directory / f"{source}.safetensors")
        aliases[source] = source_aliases
    if program.added_weights:
        save_aligned({k: v.detach().contiguous() for k, v in program.added_weights.items()},
                     directory.parent / ADDED_WEIGHTS)
    return aliases


def _dedupe(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    unique: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = tensor.contiguous()
    return unique, aliases


def _write_ir(directory: Path, program: SpeculativeProgram) -> None:
    for name, graph in program.graphs.items():
        target = directory / name
        target.mkdir(parents=True)
        (target / ir_file_name(0, "captured")).write_text(graph.captured_text)
        records = [r for r in program.pass_records if r.graph == name]
        for index, record in enumerate(records, start=1):
            (target / ir_file_name(index, record.pass_name)).write_text(record.graph_text)


def write_manifest(staging: Path, fields: dict) -> None:
    import transformers

    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "versions": {"specc": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "created_unix": int(time.time()),
        **fields,
        "files": checksums(staging),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
