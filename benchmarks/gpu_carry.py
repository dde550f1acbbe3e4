"""Engines built on this machine, carried to a lent GPU machine in a few megabytes.

A device call carries at most 64 MiB, and a bfloat16 SmolLM2 engine holds 257 MB of target
weights that are nothing but the converted checkpoint's tensors, rounded to bfloat16. So:

    python benchmarks/gpu_carry.py pack ENGINE... --checkpoint CKPT --into .gpu_carry/engines.tar.xz
    python benchmarks/gpu_carry.py unpack .gpu_carry/engines.tar.xz --checkpoint CKPT --into DIR

`pack` keeps every engine file but the target weights, and in their place a recipe: the
safetensors header (byte for byte) and, per tensor, the checkpoint tensor it rounds, or the rows of
one it copies (a draft head's reduced vocabulary); tensors the checkpoint lacks, such as
rotary frequencies or trained layers, travel inline. `unpack` writes the weights back
from the checkpoint there (the same GGUF converted on that machine) and checks each file's
sha256 against the engine's manifest, so a rebuilt engine is byte-identical to the one built
here or the unpack fails, naming the file.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tarfile
import tempfile
from pathlib import Path

RECIPE = "rebuild.json"
INLINE = "rebuild-inline.safetensors"
HEADER = "rebuild-header.bin"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("paths", nargs="+", type=Path, help="pack: engine directories; unpack: the archive")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the converted checkpoint directory")
    parser.add_argument("--into", type=Path, required=True, help="pack: the archive; unpack: a directory")
    args = parser.parse_args(argv)
    if args.action == "pack":
        pack(args.paths, args.checkpoint, args.into)
    else:
        for engine in unpack(args.paths[0], args.checkpoint, args.into):
            print(engine)
    return 0


def pack(engines: list[Path], checkpoint: Path, archive: Path) -> None:
    source = _checkpoint_tensors(checkpoint)
    with tempfile.TemporaryDirectory() as staging, tarfile.open(archive, "w:xz", preset=9) as tar:
        for engine in engines:
            recipes = {}
            for name in _weight_files(engine):
                recipes[name] = _recipe(engine / name, source, Path(staging) / engine.name / name)
            for path in sorted(engine.rglob("*")):
                relative = path.relative_to(engine).as_posix()
                if path.is_file() and relative not in recipes:
                    tar.add(path, f"{engine.name}/{relative}")
            for name in recipes:
                tar.add(Path(staging) / engine.name / name, f"{engine.name}/{name}.recipe")
    print(f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB for {len(engines)} engine(s)")


def unpack(archive: Path, checkpoint: Path, into: Path) -> list[Path]:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    source = _checkpoint_tensors(checkpoint)
    engines = sorted(path.parent.name for path in into.glob("*/manifest.json"))
    for engine in engines:
        for recipe in sorted((into / engine).rglob("*.recipe")):
            target = recipe.with_suffix("")
            _rebuild(recipe, source, target)
            _check_against_manifest(into / engine, target)
            _remove_tree(recipe)
    return [into / engine for engine in engines]


def _weight_files(engine: Path) -> list[str]:
    manifest = json.loads((engine / "manifest.json").read_text())
    return sorted(name for name in manifest["files"] if name.startswith("weights/") and name.endswith(".safetensors"))


def _recipe(weights: Path, source: dict, out: Path) -> Path:
    """`out`/: the header bytes, what fills each tensor, and the tensors the checkpoint lacks."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    header = _header_bytes(weights)
    (out / HEADER).write_bytes(header)
    plan, inline = {}, {}
    with safe_open(str(weights), "pt") as stored:
        for key in stored.keys():
            tensor = stored.get_tensor(key)
            plan[key] = _whole_source(tensor, key, source) or _row_source(tensor, source)
            if plan[key] is None:
                inline[key] = tensor
    (out / RECIPE).write_text(json.dumps({"from_checkpoint": plan}))
    save_file(inline, str(out / INLINE))
    return out


def _whole_source(tensor, key: str, source: dict) -> dict | None:
    import torch

    for name in _candidates(key, source):
        if source[name].shape == tensor.shape and torch.equal(source[name].to(tensor.dtype), tensor):
            return {"tensor": name}
    return None


def _row_source(tensor, source: dict) -> dict | None:
    """The checkpoint matrix (as rounded) that holds every row of `tensor`, and which rows."""
    if tensor.dim() != 2 or tensor.shape[0] < 2:
        return None
    for name, matrix in source.items():
        if matrix.dim() != 2 or matrix.shape[1] != tensor.shape[1]:
            continue
        index = {_raw_bytes(row): i for i, row in enumerate(matrix.to(tensor.dtype))}
        rows = [index.get(_raw_bytes(row)) for row in tensor]
        if None not in rows:
            return {"tensor": name, "rows": rows}
    return None


def _raw_bytes(tensor) -> bytes:
    """A tensor's bytes in memory order, as safetensors stores them."""
    import torch

    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _candidates(key: str, source: dict) -> list[str]:
    """The checkpoint tensor of the same name first; a tied output head is the embedding."""
    names = [key] if key in source else []
    if key.endswith("lm_head.weight"):
        names += [name for name in source if name.endswith("embed_tokens.weight")]
    return names


def _rebuild(recipe: Path, source: dict, target: Path) -> None:
    from safetensors.torch import load_file

    plan = json.loads((recipe / RECIPE).read_text())["from_checkpoint"]
    inline = load_file(str(recipe / INLINE))
    header_bytes = (recipe / HEADER).read_bytes()
    header = json.loads(header_bytes[8:])
    data = bytearray(max(entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"))
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        tensor = inline[key] if plan[key] is None else _from_checkpoint(plan[key], source, _DTYPES[entry["dtype"]])
        begin, end = entry["data_offsets"]
        raw = _raw_bytes(tensor)
        if len(raw) != end - begin:
            raise SystemExit(f"gpu_carry: {key} has {len(raw)} bytes, the header wants {end - begin}")
        data[begin:end] = raw
    target.write_bytes(header_bytes + bytes(data))


def _from_checkpoint(recipe: dict, source: dict, dtype):
    tensor = source[recipe["tensor"]].to(dtype)
    return tensor[recipe["rows"]] if "rows" in recipe else tensor


def _check_against_manifest(engine: Path, target: Path) -> None:
    from specc.engine.format import sha256_file

    manifest = json.loads((engine / "manifest.json").read_text())
    want = manifest["files"][target.relative_to(engine).as_posix()]
    digest = sha256_file(target)
    if digest != want:
        target.unlink()
        raise SystemExit(f"gpu_carry: the rebuilt {target} differs from the engine's (sha256 {digest[:12]}, "
                         f"manifest {want[:12]}): the checkpoint here is not the one the engine was built from")


def _header_bytes(path: Path) -> bytes:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return struct.pack("<Q", length) + handle.read(length)


def _checkpoint_tensors(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    if not tensors:
        raise SystemExit(f"gpu_carry: no *.safetensors in {checkpoint}")
    return tensors


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


class _Dtypes(dict):
    def __missing__(self, name):
        import torch

        table = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
        if name not in table:
            raise SystemExit(f"gpu_carry: a weight of dtype {name} cannot be rebuilt from a checkpoint")
        return table[name]


_DTYPES = _Dtypes()


if __name__ == "__main__":
    sys.exit(main())
