"""Issue 14 "everyday use": thread policy, messages, help, streaming, stop strings,
prompts from files/stdin, several prompts, the chat REPL."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest

from specc.host import threads
from specc.cli.main import build_parser, main
from specc.testing.checkpoints import build_tiny_checkpoint, tiny_chat_tokenizer


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("everyday")
    checkpoint = build_tiny_checkpoint("llama", root / "model")
    tokenizer = tiny_chat_tokenizer()
    tokenizer.model_max_length = 48     # a checkpoint limit below the engine's, as small models' 512 often is
    tokenizer.save_pretrained(checkpoint)
    assert main(["compile", str(checkpoint), "--method", "none", "-o", str(root / "engine"),
                 "--max-seq-len", "64"]) == 0
    return root, checkpoint, root / "engine"


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- threads ------------------------------------------------------------------

def test_threads_is_accepted_after_the_verb_and_before_it(workspace, capsys):
    _, _, engine = workspace
    for args in (["run", engine, "--threads", "1"], ["--threads", "1", "run", engine]):
        code, out, err = run_cli(capsys, *args, "--prompt", "w5 w6", "--max-new-tokens", "3", "--json")
        assert code == 0, err
    assert build_parser().parse_args(["--threads", "3", "run", "e", "--prompt", "x"]).threads == 3
    assert build_parser().parse_args(["run", "e", "--threads", "2", "--prompt", "x"]).threads == 2
    assert build_parser().parse_args(["run", "e", "--prompt", "x"]).threads is None
    code, _, err = run_cli(capsys, "run", engine, "--prompt", "w5", "--threads", "0")
    assert code == 2 and "--threads 0 must be at least 1" in err


def test_thread_policy_honours_the_environment_then_idle_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("SPECC_THREADS", raising=False)
    assert threads.default_threads() == (3, "$OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    for busy, expected, why in [(0.1, 2, "idle 2-core machine: both cores"),
                                (1.2, 1, "one other job: one thread, not an oversubscribed two"), (7.0, 1, "")]:
        monkeypatch.setattr(threads, "busy_cpus", lambda: (busy, f"busy now {busy}"))
        assert threads.default_threads() == (expected, f"2 cores, busy now {busy} (other processes)"), why
    monkeypatch.setattr(threads, "physical_cores", lambda: 64)
    monkeypatch.setattr(threads, "available_cpus", lambda: 64)
    monkeypatch.setattr(threads, "busy_cpus", lambda: (0.0, "busy now 0.0"))
    assert threads.default_threads()[0] == threads.MAX_DEFAULT_THREADS


def test_a_compile_that_just_ended_does_not_cost_the_next_command_a_core(monkeypatch):
    """Right after `specc compile` the 1-minute load average still says ~2 on an idle 2-core machine;
    the policy reads what other processes use now (/proc/stat over a short sample) instead."""
    for name in threads.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.2, 0.6))
    samples = iter([(1000, 5000), (1002, 5040)])       # 2 of 40 jiffies busy: 0.1 CPUs
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    assert threads.default_threads() == (2, "2 cores, busy now 0.1 (other processes)")
    samples = iter([(1000, 5000), (1020, 5040)])       # another job holds one core
    assert threads.default_threads()[0] == 1
    monkeypatch.setattr(threads, "_cpu_times", lambda: None)   # no /proc/stat: the load average
    assert threads.default_threads() == (1, "2 cores, load 1.9 (other processes)")


def test_the_threads_chosen_and_why_are_reported(monkeypatch, one_thread):
    import torch

    monkeypatch.setenv("SPECC_THREADS", "1")
    threads.apply_threads()
    assert threads.chosen_threads() == (1, "$SPECC_THREADS")
    threads.apply_threads(1)
    assert threads.chosen_threads() == (1, "--threads")
    torch.set_num_threads(2)
    assert threads.chosen_threads() == (2, "set outside specc's policy")
    torch.set_num_threads(1)


def test_long_training_follows_the_load_unless_threads_were_chosen(monkeypatch, one_thread):
    """The load average is sampled again during training; this process's own threads are
    counted out of it, and an explicit count is kept."""
    import torch

    for name in threads.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(threads, "busy_cpus", lambda: (0.0, "busy now 0.0"))
    threads.apply_threads()
    follow = threads.LoadFollower(interval=0.0)
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (3.1, 0.0, 0.0))   # our 2 threads and another job
    follow()
    assert torch.get_num_threads() == 1, "another job started: give up the core it holds"
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 0.0, 0.0))   # our one thread alone
    follow()
    assert torch.get_num_threads() == 2, "the job ended: take both cores again"
    threads.apply_threads(1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    follow()
    assert torch.get_num_threads() == 1, "--threads 1 is kept whatever the load"


def test_refmodels_build_takes_threads_and_the_cache_key_includes_them():
    from specc.refmodels import __main__ as refmodels_cli
    from specc.refmodels import cache_key, get_spec
    from specc.data.corpora import CorpusSelection

    args = refmodels_cli._parser().parse_args(["build", "tiny", "--threads", "2"])
    assert args.threads == 2
    selection = CorpusSelection.__new__(CorpusSelection)
    object.__setattr__(selection, "fingerprint", lambda: "corpus")
    spec = get_spec("tiny")
    assert cache_key(spec, selection, 1) != cache_key(spec, selection, 2)


# --- messages -----------------------------------------------------------------

def test_bad_method_settings_fail_before_any_work(workspace, capsys, monkeypatch):
    import specc.compiler

    root, checkpoint, _ = workspace
    monkeypatch.setattr(specc.compiler, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    for args, message in [
        (["--method", "kangaroo", "--set", "exit_layer=99"], "--set exit_layer=99 must be below the model's 3 layers"),
        (["--method", "swift", "--set", "calib_data=/nonexistent.txt"], "--set calib_data=/nonexistent.txt: no such file"),
        (["--method", "kangaroo", "--set", "calib_data=/nonexistent.txt"], "--set calib_data=/nonexistent.txt"),
    ]:
        code, _, err = run_cli(capsys, "compile", checkpoint, *args, "-o", root / "x")
        assert code == 2 and message in err and "--prompts" not in err, err
        assert not (root / "x").exists()


@pytest.mark.parametrize("verb", ["run", "bench", "chat", "serve"])
def test_load_time_settings_on_an_engine_without_lookup_branches_are_refused(workspace, capsys, verb):
    _, _, engine = workspace
    extra = ["--prompt", "w5"] if verb == "run" else []
    code, _, err = run_cli(capsys, verb, engine, "--set", "lookup=true", *extra)
    assert code == 2 and "method 'none' has no settings that can change when the engine loads" in err, err


def test_missing_text_corpus_is_an_info_notice_not_a_warning(tmp_path, caplog):
    from specc.data import corpora as corpus

    with caplog.at_level(logging.INFO, logger="specc.data.corpora"):
        corpus._text_source_files(tmp_path)
    notices = [r for r in caplog.records if "text corpus" in r.getMessage()]
    assert notices and all(r.levelno == logging.INFO for r in notices)


def test_a_bfloat16_float_engine_for_a_cpu_that_emulates_bfloat16_is_warned_about(monkeypatch, caplog, tmp_path):
    from dataclasses import replace

    from specc import compiler

    request = compiler.CompileRequest(model="m", method="none", output=tmp_path / "e", backend="aoti",
                                      dtype="bfloat16", device="cpu")
    warned = []
    for emulated in (True, False):
        monkeypatch.setattr(compiler, "emulates_bfloat16", lambda: emulated)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            for each in (request, replace(request, quantize="q4"), replace(request, dtype="float32")):
                compiler.warn_emulated_bfloat16(each)
        warned.append([r.getMessage() for r in caplog.records if r.levelno == logging.WARNING])
    assert len(warned[0]) == 1 and "--quantize q4" in warned[0][0] and warned[1] == []


def test_compile_output_has_only_stage_lines(workspace, tmp_path):
    """HF's loading bar and advisory warnings must not break the stage lines (subprocess: real stderr)."""
    _, checkpoint, _ = workspace
    result = subprocess.run([sys.executable, "-m", "specc.cli.main", "compile", str(checkpoint), "--method", "none",
                             "-o", str(tmp_path / "e"), "--max-seq-len", "32"], capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("compiling ") and all(line.startswith("  ") for line in lines[1:]), result.stderr
    assert all(line.rstrip().endswith("s") for line in lines[1:]), result.stderr
    assert "Loading weights" not in result.stderr and "\r" not in result.stderr


# --- help and version ---------------------------------------------------------

@pytest.mark.parametrize("verb", ["compile", "run", "chat", "serve", "inspect", "methods", "bench"])
def test_every_verb_has_full_help_with_examples(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([verb, "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())    # argparse wraps lines
    assert "examples:" in out and "--threads" in out
    if verb == "run":
        for text in ("engine directory written by", "--prompt TEXT", "--max-new-tokens N", "(default: 64)",
                     "--top-p P", "(default: 1.0)", "--seed S", "--stop STRING", "--prompt-file"):
            assert text in out, text


def test_version(capsys):
    from specc import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"specc {__version__}"


# --- generation ---------------------------------------------------------------

def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_streamed_output_equals_the_unstreamed_one(workspace, capsys):
    _, _, engine = workspace
    args = ["run", engine, "--prompt", "w5 w6 w7", "--max-new-tokens", "12"]
    code, streamed, _ = run_cli(capsys, *args)
    assert code == 0
    code, whole, _ = run_cli(capsys, *args, "--no-stream")
    assert code == 0 and streamed == whole and streamed.startswith("w5 w6 w7")


def test_streaming_writes_as_rounds_are_accepted(workspace, monkeypatch):
    from specc.cli import generation

    _, _, engine = workspace
    pieces = []
    monkeypatch.setattr(generation, "_write", pieces.append)
    assert main(["run", str(engine), "--prompt", "w5 w6", "--max-new-tokens", "8"]) == 0
    assert pieces[0] == "w5 w6" and len(pieces) >= 1 + 8 - 1, pieces   # the prompt, then piece by piece


def test_stop_strings_end_generation_early(workspace, capsys):
    _, _, engine = workspace
    code, out, _ = run_cli(capsys, "run", engine, "--prompt", "w5 w6 w7", "--max-new-tokens", "20", "--json")
    full = _json_lines(out)[0]
    words = full["text"].split()
    assert len(words) >= 6
    stop = " " + words[3]
    code, out, _ = run_cli(capsys, "run", engine, "--prompt", "w5 w6 w7", "--max-new-tokens", "20", "--json",
                           "--stop", stop)
    cut = _json_lines(out)[0]
    assert code == 0 and cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][: full["text"].index(stop)]
    assert cut["stats"]["target_forward_passes"] < full["stats"]["target_forward_passes"], "generation stopped"


def test_prompts_from_files_stdin_and_several_per_run(workspace, capsys, monkeypatch, tmp_path):
    _, _, engine = workspace
    (tmp_path / "p.txt").write_text("w9 w10")
    monkeypatch.setattr(sys, "stdin", io.StringIO("w7 w8"))
    code, out, err = run_cli(capsys, "run", engine, "--prompt", "w5 w6", "--prompt", "-", "--prompt-file",
                             tmp_path / "p.txt", "--max-new-tokens", "4", "--json")
    assert code == 0, err
    results = _json_lines(out)
    assert len(results) == 3
    singles = []
    for prompt in ("w5 w6", "w7 w8", "w9 w10"):
        code, single, _ = run_cli(capsys, "run", engine, "--prompt", prompt, "--max-new-tokens", "4", "--json")
        singles.append(_json_lines(single)[0]["token_ids"])
    assert [r["token_ids"] for r in results] == singles
    code, _, err = run_cli(capsys, "run", engine, "--prompt-file", tmp_path / "missing.txt")
    assert code == 2 and "--prompt-file" in err and "does not exist" in err
    code, _, err = run_cli(capsys, "run", engine)
    assert code == 2 and "no prompt" in err


def test_chat_repl_keeps_the_conversation(workspace, monkeypatch, capsys):
    import specc.data.chat
    from specc.cli import generation

    _, _, engine = workspace
    seen = []
    encode = specc.data.chat.conversation_ids
    monkeypatch.setattr(specc.data.chat, "conversation_ids", lambda tok, messages: seen.append(messages) or encode(tok, messages))
    args = build_parser().parse_args(["chat", str(engine), "--max-new-tokens", "4", "--no-stream"])
    assert generation.chat(args, stdin=io.StringIO("w5 w6\n/reset\nw7\nw8\n")) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.strip()]) == 3
    assert [m["content"] for m in seen.pop(0)] == ["?"], "the reply budget measures the template first"
    assert [m["content"] for m in seen[0]] == ["w5 w6"]
    assert [m["content"] for m in seen[1]] == ["w7"], "/reset starts a new conversation"
    assert [m["role"] for m in seen[2]] == ["user", "assistant", "user"] and seen[2][0]["content"] == "w7"


@pytest.mark.parametrize("flag, reuses", [([], True), (["--no-prefix-reuse"], False)])
def test_a_chat_turn_prefills_only_what_the_last_turn_did_not_leave_cached(workspace, monkeypatch, capsys, flag,
                                                                          reuses):
    import specc.runtime.textgen
    from specc.cli import generation

    _, _, engine = workspace
    reused = []
    generate_text = specc.runtime.textgen.generate_text

    def recording(*args, **kwargs):
        result = generate_text(*args, **kwargs)
        reused.append(result.stats.reused_prompt_tokens)
        return result

    monkeypatch.setattr(specc.runtime.textgen, "generate_text", recording)
    args = build_parser().parse_args(["chat", str(engine), "--max-new-tokens", "4", "--no-stream", *flag])
    assert generation.chat(args, stdin=io.StringIO("w5 w6\nw7\n")) == 0
    assert reused[0] == 0 and (reused[1] > 0) == reuses


def test_chat_on_a_short_engine_replies_within_what_fits(workspace, capsys):
    """The engine holds 64 tokens: the default reply budget (256) is cut to fit, so messages get replies."""
    from specc.cli import generation

    _, _, engine = workspace
    args = build_parser().parse_args(["chat", str(engine), "--no-stream"])
    assert generation.chat(args, stdin=io.StringIO("w5 w6\nw7\n")) == 0
    out, err = capsys.readouterr()
    assert len([line for line in out.splitlines() if line.strip()]) == 2, err
    assert "exceeds" not in err


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "100"], "--max-new-tokens 100 leaves no room for a message in the engine's max sequence "
                                  "length 64"),
    (["--system", " ".join(["w9"] * 80)], "the engine's max sequence length 64 leaves no room to chat"),
])
def test_chat_that_cannot_fit_any_message_is_refused_at_start(workspace, capsys, flags, message):
    _, _, engine = workspace
    code, out, err = run_cli(capsys, "chat", engine, *flags)
    assert code == 2 and message in err and not out


def test_a_refused_chat_message_says_what_fits_and_fails_a_piped_chat(workspace):
    """Too long a message gets specc's message, the next one its reply, and piped input exits 1."""
    _, _, engine = workspace
    done = subprocess.run([sys.executable, "-m", "specc.cli.main", "chat", str(engine), "--max-new-tokens", "8"],
                          input=" ".join(["w5"] * 70) + "\nw6\n", capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr
    assert "+ 8 reply tokens exceeds the engine's max sequence length 64: at most 56 message tokens fit" in done.stderr
    assert len([line for line in done.stdout.splitlines() if line.strip()]) == 1, "the next message got its reply"


def test_the_engine_tokenizer_leaves_length_checks_to_the_engine(workspace):
    """A prompt longer than the checkpoint's tokenizer limit (48 here, 512 on many small models) logs no
    transformers warning ("Token indices sequence length ... (73 > 48)") beside specc's own check,
    whatever the logging level (the Python API does not quiet libraries as the CLI does)."""
    from specc.data.chat import conversation_ids
    from specc.engine.loaded import load_engine

    _, _, engine_dir = workspace
    engine = load_engine(engine_dir)
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    library = logging.getLogger("transformers")
    level = library.level
    library.addHandler(handler)
    library.setLevel(logging.WARNING)
    try:
        assert len(conversation_ids(engine.tokenizer, [{"role": "user", "content": " ".join(["w5"] * 70)}])) > 48
        assert len(engine.encode(" ".join(["w6"] * 60))) > 48
    finally:
        library.removeHandler(handler)
        library.setLevel(level)
    assert not [m for m in logged if "sequence length" in m], logged
