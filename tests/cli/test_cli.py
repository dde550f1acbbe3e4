"""The command line: happy paths, every error path, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from specc.cli.main import main
from specc.errors import UsageError
from specc.testing.checkpoints import build_tiny_checkpoint


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    checkpoint = build_tiny_checkpoint("llama", root / "model")
    assert main(["compile", str(checkpoint), "--method", "none", "-o", str(root / "engine"),
                 "--max-seq-len", "48"]) == 0
    return root, checkpoint


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_json_reports_text_ids_and_stats(workspace, capsys):
    root, _ = workspace
    code, out, err = run_cli(capsys, "run", str(root / "engine"), "--prompt", "w5 w6 w7", "--max-new-tokens", "6",
                             "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"text", "token_ids", "finish_reason", "stats"}
    assert 1 <= len(data["token_ids"]) <= 6
    for key in ("mean_accepted_length", "acceptance_rate", "target_forward_passes", "drafted_tokens",
                "new_tokens", "tokens_per_second", "wall_seconds"):
        assert key in data["stats"]
    assert data["stats"]["acceptance_rate"] is None and data["stats"]["mean_accepted_length"] == 1.0


def test_run_sampling_is_reproducible_with_a_seed(workspace, capsys):
    root, _ = workspace
    args = ["run", str(root / "engine"), "--prompt", "w9 w10", "--max-new-tokens", "8", "--temperature", "1.0",
            "--top-p", "0.9", "--seed", "3", "--json"]
    first = json.loads(run_cli(capsys, *args)[1])["token_ids"]
    assert json.loads(run_cli(capsys, *args)[1])["token_ids"] == first


def test_inspect_shows_passes_and_graphs(workspace, capsys):
    root, _ = workspace
    code, out, _ = run_cli(capsys, "inspect", str(root / "engine"))
    assert code == 0
    assert "pass insert_kv_cache (changed" in out and "aten.index_put_.default=" in out
    code, out, _ = run_cli(capsys, "inspect", str(root / "engine"), "--graph", "target")
    assert code == 0 and "index_put_" in out and "def forward" in out
    code, out, _ = run_cli(capsys, "inspect", str(root / "engine"), "--after", "insert_attention_mask")
    assert code == 0 and "attn_mask" in out and "index_put_" not in out


def test_methods_lists_fields_with_defaults(capsys):
    code, out, _ = run_cli(capsys, "methods")
    assert code == 0 and "none" in out and "draft-model" in out and "num_draft_tokens: int = 4" in out


@pytest.mark.parametrize("args,code,message", [
    (["compile", "{root}/missing", "--method", "none", "-o", "{root}/x"], 2, "does not exist"),
    (["compile", "{root}", "--method", "none", "-o", "{root}/x"], 2, "has no config.json"),
    (["compile", "{ckpt}", "--method", "medusa", "-o", "{root}/x"], 2, "unknown method 'medusa'; choose one of"),
    (["compile", "{ckpt}", "--method", "none", "--backend", "tvm", "-o", "{root}/x"], 2,
     "unknown backend 'tvm'; choose one of: eager, inductor, aoti"),
    (["compile", "{ckpt}", "--method", "none", "--dtype", "int4", "-o", "{root}/x"], 2, "unknown dtype 'int4'"),
    (["compile", "{ckpt}", "--method", "none", "-o", "{root}/engine"], 2, "already exists; pass --force"),
    (["compile", "{ckpt}", "--method", "draft-model", "-o", "{root}/x"], 2, "compiles a draft checkpoint too; pass it with --set draft_model=DIR"),
    (["compile", "{ckpt}", "--method", "draft-model", "--set", "draft_model={ckpt}", "--set", "tree_width=wide",
      "-o", "{root}/x"], 2, "tree_width must be int, got 'wide'"),
    (["compile", "{ckpt}", "--method", "draft-model", "--set", "draft_model={ckpt}", "--set", "num_draft_tokens",
      "-o", "{root}/x"], 2, "malformed config setting 'num_draft_tokens'; write it as key=value"),
    (["compile", "{ckpt}", "--method", "none", "--set", "gamma=3", "-o", "{root}/x"], 2, "unknown config field"),
    (["compile", "{ckpt}", "--method", "none", "--max-seq-len", "2", "-o", "{root}/x"], 2, "--max-seq-len 2"),
    (["compile", "{ckpt}", "--method", "none", "--device", "gpu0", "-o", "{root}/x"], 2,
     "--device 'gpu0' is not a device; use one of auto, cpu, cuda, cuda:N"),
    (["run", "{root}/engine", "--prompt", "w5", "--device", "mps"], 2,
     "specc runs on auto, cpu, cuda, cuda:N, not mps"),
    (["run", "{root}/engine", "--prompt", ""], 2, "the prompt is empty"),
    (["run", "{root}/engine", "--prompt", "w5", "--max-new-tokens", "100"], 2, "exceeds the engine's max sequence"),
    (["run", "{root}/engine", "--prompt", "w5", "--temperature", "-1"], 2, "--temperature -1.0 is negative"),
    (["run", "{root}/engine", "--prompt", "w5", "--top-p", "1.5"], 2, "--top-p 1.5 is outside (0, 1]"),
    (["run", "{root}/nothing", "--prompt", "w5"], 2, "does not exist"),
    (["run", "{ckpt}", "--prompt", "w5"], 2, "is a model checkpoint, not an engine; compile it first: specc compile"),
    (["run", "{ckpt}/config.json", "--prompt", "w5"], 2, "is a file, not an engine"),
    (["run", "{root}", "--prompt", "w5"], 2, "is not a specc engine (it has no manifest.json)"),
    (["inspect", "{root}/engine", "--graph", "draft"], 2, "no graph 'draft'"),
    (["inspect", "{root}/engine", "--after", "fuse_everything"], 2, "no pass 'fuse_everything'"),
])
def test_error_paths(workspace, capsys, args, code, message):
    root, checkpoint = workspace
    args = [a.format(root=root, ckpt=checkpoint) for a in args]
    got_code, _, err = run_cli(capsys, *args)
    assert got_code == code, err
    assert message in err and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("specc:")] == [err.splitlines()[-1]], err
    assert not (root / "x").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
@pytest.mark.parametrize("verb", ["compile", "run", "bench"])
def test_device_cuda_without_a_gpu_is_one_clear_line(workspace, capsys, verb):
    root, checkpoint = workspace
    args = {"compile": ["compile", str(checkpoint), "--method", "none", "-o", str(root / "x")],
            "run": ["run", str(root / "engine"), "--prompt", "w5"],
            "bench": ["bench", str(root / "engine")]}[verb]
    code, _, err = run_cli(capsys, *args, "--device", "cuda")
    assert code == 2 and "--device cuda: this machine has no CUDA device" in err and "Traceback" not in err
    assert not (root / "x").exists()


def test_an_aoti_engine_runs_only_on_the_device_kind_it_was_compiled_for():
    from specc.engine.loaded import check_engine_device
    from specc.lower.registry import get_backend

    manifest = {"backend": "aoti", "device": "cuda"}
    with pytest.raises(UsageError, match="compiled for cuda, and its packages run only there"):
        check_engine_device(manifest, get_backend("aoti"), torch.device("cpu"))
    check_engine_device(manifest, get_backend("inductor"), torch.device("cpu"))   # relowered at load: fine
    check_engine_device({"backend": "eager"}, get_backend("eager"), torch.device("cpu"))


def test_unsupported_architecture_names_the_supported_list(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    code, _, err = run_cli(capsys, "compile", str(tmp_path / "gpt2"), "--method", "none", "-o", str(tmp_path / "e"))
    assert code == 2 and "unsupported architecture 'gpt2'" in err and "llama, mistral, qwen2, qwen3, phi3" in err
    assert not (tmp_path / "e").exists()


def test_hub_id_offline_says_to_pass_a_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err = run_cli(capsys, "compile", "someone/some-model", "--method", "none", "-o", str(tmp_path / "e"))
    assert code == 2 and "not available in the local Hugging Face cache" in err and "pass a checkpoint directory" in err


def test_debug_shows_the_traceback(workspace):
    root, _ = workspace
    with pytest.raises(Exception):
        main(["--debug", "run", str(root / "nothing"), "--prompt", "w5"])


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "specc.cli.main", "methods"], capture_output=True, text=True)
    assert result.returncode == 0 and "draft-model" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "specc.cli.main", "compile"], capture_output=True, text=True)
    assert bad.returncode == 2


def test_unsupported_backend_for_a_method_is_refused_before_work(workspace, capsys, monkeypatch):
    import dataclasses

    from specc.contract import descriptor

    demanding = dataclasses.replace(descriptor.get_method("none"), name="demanding",
                                    requires=frozenset({"tensor_cores"}))
    monkeypatch.setitem(descriptor._REGISTRY, "demanding", demanding)
    root, checkpoint = workspace
    code, _, err = run_cli(capsys, "compile", str(checkpoint), "--method", "demanding", "--backend", "aoti",
                           "-o", str(root / "x"))
    assert code == 2 and "needs tensor_cores, which backend 'aoti' does not provide" in err
    assert not (root / "x").exists()


def test_inspect_cuts_long_method_state_lists():
    from specc.engine.inspect_engine import state_value

    state = {"draft_vocabulary": list(range(8192)), "threshold": 0.9, "layers": [3, 5]}
    text = state_value(state)
    assert text.startswith("{'draft_vocabulary': [0, 1, 2,") and "… (8192 items)]" in text
    assert "8191" not in text and len(text) < 200
    assert text.endswith("'threshold': 0.9, 'layers': [3, 5]}")


def test_inspect_shows_where_a_long_training_curve_began_and_ended():
    from specc.engine.inspect_engine import state_value

    curve = [{"step": 50 * i, "acceptance": i / 100} for i in range(61)]
    text = state_value({"training": {"heldout": curve}})
    assert text == ("{'training': {'heldout': [{'step': 0, 'acceptance': 0.0}, {'step': 50, 'acceptance': 0.01}, "
                    "… (61 items), {'step': 3000, 'acceptance': 0.6}]}}")
    assert state_value([{"a": 1}, {"a": 2}]) == "[{'a': 1}, {'a': 2}]"


def test_compile_says_what_each_ahead_of_time_graph_wrote(workspace, tmp_path, capsys):
    _, checkpoint = workspace
    code, _, err = run_cli(capsys, "compile", str(checkpoint), "--method", "none", "--backend", "onnx",
                           "-o", str(tmp_path / "engine"), "--max-seq-len", "48")
    assert code == 0, err
    written = (tmp_path / "engine" / "compiled" / "target.onnx").stat().st_size
    assert f"graph 'target': target.onnx ({written / 1e6:.1f} MB) in " in err
    assert "lowering (onnx) ...\n" in err and "lowering (onnx): " in err
