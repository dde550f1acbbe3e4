"""GGUF input: conversion into a cached checkpoint, the metadata checks, and how
`resolve_checkpoint` finds a GGUF file. Uses tiny GGUF files written here with
the `gguf` package's GGUFWriter, so nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from specc.capture import gguf as gguf_input  # noqa: E402
from specc.capture.gguf import MARKER_FILE, convert_gguf, converted_head_type, file_sha256  # noqa: E402
from specc.capture.load import load_model, load_tokenizer, resolve_checkpoint  # noqa: E402
from specc.data.chat import chat_prompt_ids  # noqa: E402
from specc.cli.main import main as cli_main  # noqa: E402
from specc.errors import UsageError  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order: the 256 base tokens of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(path: Path, arch: str = "llama", *, qtype: str = "Q8_0", int_weights: bool = False,
                    layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
                    seed: int = 0) -> Path:
    """A seeded llama-layout GGUF with a byte-level BPE tokenizer and a chat template."""
    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_alphabet(), "Ġt", "he"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("specc tiny test model")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    quant = getattr(gguf.GGMLQuantizationType, qtype)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        if int_weights:
            writer.add_tensor(name, data.astype(np.int32))   # an I32 tensor: no float type to dequantize from
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.05 * rng.standard_normal(hidden)).astype(np.float32))

    head_dim = hidden // heads
    matrix("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private specc cache root for the module (`$SPECC_CACHE_DIR`)."""
    root = tmp_path_factory.mktemp("specc-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECC_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tiny(cache, tmp_path_factory):
    """(GGUF file, its converted checkpoint), converted once for the module."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    path = write_tiny_gguf(folder / "tiny.Q8_0.gguf")
    return path, convert_gguf(path, progress=False)


def _refuse_conversion(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_input, "_write_checkpoint", refuse)


def test_conversion_is_a_checkpoint_equal_to_transformers_gguf_load(tiny, cache):
    path, checkpoint = tiny
    sha = file_sha256(path)
    assert checkpoint == cache / "gguf" / sha[:16]
    assert (checkpoint / MARKER_FILE).is_file() and (checkpoint / "model.safetensors").is_file()
    assert not list(checkpoint.parent.glob(".*.tmp"))   # the staging directory was renamed into place
    from transformers import AutoModelForCausalLM

    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    converted = load_model(checkpoint)
    assert "quantization_config" not in converted.config.to_dict()
    expected, actual = direct.state_dict(), converted.state_dict()
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)
    ids = torch.tensor([[5, 80, 120, 7]])
    greedy = dict(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(direct.generate(ids, **greedy), converted.generate(ids, **greedy))


def test_a_conversion_records_the_type_its_lm_head_was_stored_in(tiny, tmp_path):
    assert converted_head_type(tiny[1]) == "Q8_0"    # tied: the embedding table's type
    four_bit = convert_gguf(write_tiny_gguf(tmp_path / "tiny.Q4_0.gguf", qtype="Q4_0"), progress=False)
    assert converted_head_type(four_bit) == "Q4_0"
    assert converted_head_type(tmp_path) is None       # no conversion marker: not from a GGUF


def test_a_conversion_parses_the_file_once_and_builds_one_name_map(tiny, tmp_path, monkeypatch):
    """transformers reads the file for the tokenizer, the config and the weights, and maps names
    per submodule (`specc.capture.gguf_reads`); outside a conversion gguf is as it was."""
    import gguf

    path, checkpoint = tiny
    opened, mapped = [], []
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "GGUFReader", lambda *args: opened.append(args) or reader_class(*args))
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *args: mapped.append(args) or name_map(*args))
    counting_reader, counting_map = gguf.GGUFReader, gguf.get_tensor_name_map
    again = convert_gguf(path, cache_dir=tmp_path, progress=False)
    assert len(opened) == 1 and len(mapped) == 1
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (counting_reader, counting_map)
    assert (again / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()


def test_conversion_keeps_the_tokenizer_and_chat_template(tiny):
    _, checkpoint = tiny
    tokenizer = load_tokenizer(checkpoint)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    ids = chat_prompt_ids(tokenizer, "the")
    assert ids[0] == 1   # <|im_start|>, from the template: no BOS added twice
    assert tokenizer.decode(ids) == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n"


def test_conversion_is_reused(tiny, monkeypatch):
    path, checkpoint = tiny
    _refuse_conversion(monkeypatch)
    assert convert_gguf(path, progress=False) == checkpoint
    # the same contents under another name are the same conversion
    copy = path.parent / "renamed-copy.bin"
    copy.write_bytes(path.read_bytes())
    assert convert_gguf(copy, progress=False) == checkpoint


def test_resolve_checkpoint_accepts_a_gguf_file_or_a_folder_holding_one(tiny, monkeypatch):
    path, checkpoint = tiny
    _refuse_conversion(monkeypatch)
    assert resolve_checkpoint(str(path)) == checkpoint
    assert resolve_checkpoint(str(path.parent)) == checkpoint


def test_a_checkpoint_folder_with_a_gguf_beside_it_is_used_as_is(tmp_path, monkeypatch):
    _refuse_conversion(monkeypatch)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.gguf").write_bytes(b"")
    assert resolve_checkpoint(str(tmp_path)) == tmp_path


def test_several_gguf_files_ask_to_name_one(tmp_path, capsys):
    for name in ("b.Q4_0.gguf", "a.Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(UsageError, match=r"holds 2 \.gguf files \(a\.Q8_0\.gguf, b\.Q4_0\.gguf\); name one"):
        resolve_checkpoint(str(tmp_path))
    assert cli_main(["compile", str(tmp_path), "--method", "none", "-o", str(tmp_path / "engine")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("specc: error: model directory")


def test_unsupported_architecture_is_refused_before_loading(tmp_path, cache, monkeypatch):
    path = write_tiny_gguf(tmp_path / "other.gguf", arch="gpt2")
    _refuse_conversion(monkeypatch)
    with pytest.raises(UsageError, match=r"unsupported GGUF architecture 'gpt2'.*llama, mistral, qwen2, qwen3, "
                                         r"phi3") as raised:
        convert_gguf(path, progress=False)
    assert "\n" not in str(raised.value)
    assert not (cache / "gguf" / file_sha256(path)[:16]).exists()


def test_unsupported_tensor_type_is_refused_naming_the_supported_ones(tmp_path, monkeypatch):
    path = write_tiny_gguf(tmp_path / "ints.gguf", int_weights=True)
    _refuse_conversion(monkeypatch)
    with pytest.raises(UsageError, match=r"unsupported GGUF quantization type I32 in ints\.gguf: "
                                         r"specc dequantizes F32, .*Q8_0.*Q4_1"):
        convert_gguf(path, progress=False)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(UsageError, match="not a readable GGUF file"):
        resolve_checkpoint(str(path))


def test_other_files_are_still_refused(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(UsageError, match="is a file; pass a checkpoint directory or a .gguf file"):
        resolve_checkpoint(str(path))
