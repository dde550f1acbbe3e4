"""An engine's method config, read back from its manifest, or a refusal that says how to recompile.

The manifest's `method_config` is what `MethodConfig.to_json` wrote: the config's
`version` and its fields. One written before configs carried a version reads as
version 1, so engines from an older specc keep loading while their fields still
parse; a version this specc cannot read, or fields that no longer parse, are refused
with the `specc compile` command that rebuilds the engine.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from specc.contract.config import VERSION_KEY, ConfigVersionError, MethodConfig
from specc.errors import UsageError


def read_method_config(method, manifest: dict, engine_dir: Path) -> MethodConfig:
    """`method`'s config as the engine at `engine_dir` recorded it in `manifest`."""
    data = manifest.get("method_config") or {}
    try:
        return method.config_class.from_json(data)
    except ConfigVersionError as exc:
        written = (f"with {method.name} config version {exc.found}" if exc.recorded
                   else f"by a specc that recorded no {method.name} config version (read as version {exc.found})")
        newer = (f", or load it with the specc that wrote it ({manifest['versions']['specc']})"
                 if exc.found > exc.expected and manifest.get("versions", {}).get("specc") else "")
        raise UsageError(
            f"engine {engine_dir} was compiled {written} (this specc reads version {exc.expected}): recompile "
            f"it with `{recompile_command(method, manifest, engine_dir)}`, adding the --set options it was "
            f"compiled with{newer}"
        ) from None
    except UsageError as exc:
        version = data.get(VERSION_KEY)
        written = f"config version {version}" if version is not None else "recorded without a version"
        raise UsageError(
            f"engine {engine_dir}: its {method.name} settings ({written}) do not fit this specc's {method.name} "
            f"config ({exc}): recompile it with `{recompile_command(method, manifest, engine_dir)}`, adding the "
            f"--set options it was compiled with"
        ) from None


def recompile_command(method, manifest: dict, engine_dir: Path) -> str:
    """The `specc compile` command that rebuilds the engine at `engine_dir` from its source
    checkpoint with the manifest's backend, dtype, length and device, naming the extra
    checkpoints the method needs (`--set FIELD=DIR` per extra source); the method's other settings are
    left to the user (the manifest holds the config after training, not the request)."""
    config = manifest.get("method_config") or {}
    words = ["specc", "compile", str(manifest.get("source_checkpoint", "MODEL")), "--method", method.name]
    for flag, key in (("--backend", "backend"), ("--dtype", "dtype"), ("--max-seq-len", "max_seq_len")):
        if manifest.get(key) is not None:
            words += [flag, str(manifest[key])]
    if manifest.get("device") not in (None, "cpu"):
        words += ["--device", str(manifest["device"])]
    if manifest.get("kernels"):
        words.append("--kernels")
    for source in getattr(method, "extra_sources", ()):
        if config.get(source.config_field):
            words += ["--set", f"{source.config_field}={config[source.config_field]}"]
    words += ["-o", str(engine_dir), "--force"]
    return shlex.join(words)
