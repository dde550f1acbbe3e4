"""Benchmark one engine against its baselines in one process, on the same prompts."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from specc.bench.bandwidth import BandwidthSamples, kv_cache_read_bytes
from specc.bench.baselines import build_baselines, source_checkpoint
from specc.bench.document import build_document
from specc.bench.machine import machine_info, versions
from specc.bench.memory import MemoryProbe
from specc.data.prompts import load_prompt_set
from specc.bench.runner import run_interleaved
from specc.bench.systems import ENGINE, SPECC_NONE, engine_system
from specc.errors import UsageError
from specc.runtime.masks import KEY_BLOCK

MIN_REPEATS_FOR_SPREAD = 3


@dataclass(frozen=True)
class BenchOptions:
    engine: Path
    prompts: str = "code"
    max_new_tokens: int = 64
    repeats: int = 3
    num_prompts: int | None = None
    baseline_engine: Path | None = None   # a compiled `none` engine to reuse instead of compiling one
    show_progress: bool = True
    chat_template: bool = True            # chat-format conversational prompts when the tokenizer has a template
    device: str | None = None             # --device (None: auto; an aoti engine: where it was compiled for)
    peers: tuple[str, ...] = ()           # --baseline: other engines run as baselines (llama.cpp)
    gguf: Path | None = None              # --gguf: the file llama.cpp runs (default: the engine's source GGUF)
    settings: tuple[str, ...] = ()        # --set: lookup branch settings changed as the engine loads


def benchmark(options: BenchOptions) -> dict:
    """Run every system on every prompt and return the benchmark document."""
    from specc.engine.loaded import load_engine

    if options.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {options.max_new_tokens} must be at least 1")
    if options.repeats < 1:
        raise UsageError(f"--repeats {options.repeats} must be at least 1")
    quiet_transformers()
    engine = load_engine(options.engine, device=options.device, settings=list(options.settings))
    source_checkpoint(engine.manifest)   # fail before any other work if the checkpoint is gone
    peer_gguf = _peer_gguf(engine, options)
    prompt_set = load_prompt_set(options.prompts, options.num_prompts)
    prompts, prompt_ids, notes = encode_fitting(engine, prompt_set, options.max_new_tokens, options.chat_template)
    chat_formatted = any(p["chat_template"] for p in prompts)
    notes = prompt_set.notes + notes
    if options.settings:
        notes.append(f"set as the engine loaded (--set): {', '.join(options.settings)}; the method_config "
                     f"reported is the one it ran with")
    if engine.max_draft_rows is not None:
        notes.append(f"drafts capped at {engine.max_draft_rows} nodes, root included, verified as chains within "
                     f"one {KEY_BLOCK}-key block: the rows the {engine.manifest['backend']} backend computes in "
                     f"{engine.manifest['dtype']} exactly as a decode step, so the engine can match specc none")
    if options.repeats < MIN_REPEATS_FOR_SPREAD:
        notes.append(f"only {options.repeats} repeat(s): the median, min and max are not a spread; "
                     f"use --repeats {MIN_REPEATS_FOR_SPREAD} or more for reportable figures")
    memory = MemoryProbe()
    with tempfile.TemporaryDirectory(prefix="specc-bench-") as workdir:
        baselines = build_baselines(engine, options.max_new_tokens, Path(workdir), options.baseline_engine)
        under_test = engine_system(ENGINE, f"specc {engine.manifest['method']}", "engine", engine,
                                   options.max_new_tokens)
        peers = _peer_systems(engine, options, peer_gguf)
        systems = baselines.systems + peers + [under_test]
        bandwidth = BandwidthSamples()
        runs = run_interleaved(systems, prompt_ids, options.repeats, memory, options.show_progress,
                               between_repeats=bandwidth)
    bound = bandwidth.bound(baselines.none_read_bytes,
                            kv_cache_read_bytes(baselines.none_cache_layout, runs, SPECC_NONE, prompt_ids))
    settings = {"device": str(engine.device), "prompt_set": prompt_set.name, "prompt_source": prompt_set.source,
                "num_prompts": len(prompts),
                "max_new_tokens": options.max_new_tokens, "repeats": options.repeats,
                "chat_template": chat_formatted,
                "warmup_runs_per_system": 1, "decoding": "greedy, batch 1", "interleaved": True,
                "throughput": "per repeat: new tokens / wall seconds over the group's prompts; "
                              "median, min and max over repeats",
                "mean_accepted_length": "new tokens per target forward, bonus token and prefill included"}
    return build_document(
        engine_manifest={**engine.manifest, "method_config": engine.config.to_json()},
        engine_path=str(options.engine), model_info=baselines.model_info,
        machine=machine_info(), versions=versions(), settings=settings, prompts=prompts, systems=systems,
        runs=runs, memory=memory, notes=notes + baselines.notes, bandwidth_bound=bound,
    )


def _peer_gguf(engine, options: BenchOptions) -> Path | None:
    """The GGUF llama.cpp will run, checked (with llama-cpp-python's presence) before any other work."""
    from specc.bench.llama_cpp import BASELINE_NAMES, import_llama_cpp, source_gguf

    unknown = [name for name in options.peers if name not in BASELINE_NAMES]
    if unknown:
        raise UsageError(f"--baseline {unknown[0]} is not a system specc runs; choose from: {', '.join(BASELINE_NAMES)}")
    if not options.peers:
        return None
    if engine.device.type != "cpu":
        raise UsageError("--baseline llama.cpp runs on the CPU: benchmark a CPU engine (--device cpu)")
    import_llama_cpp()
    return source_gguf(engine.manifest, options.gguf)


def _peer_systems(engine, options: BenchOptions, gguf: Path | None) -> list:
    if gguf is None:
        return []
    import torch

    from specc.bench.llama_cpp import llama_cpp_systems

    return llama_cpp_systems(gguf, torch.get_num_threads(), options.max_new_tokens, engine.max_seq_len)


def encode_fitting(engine, prompt_set, max_new_tokens: int,
                    chat_template: bool = True) -> tuple[list[dict], list[list[int]], list[str]]:
    """Token ids of the prompts that fit the engine's max_seq_len with the generation.

    Conversational prompts (`Prompt.chat`, Spec-Bench turns) go through the
    tokenizer's chat template as one user turn when it has one and
    `chat_template` is on; everything else is encoded as plain text."""
    from specc.data.chat import chat_prompt_ids, has_chat_template

    conversational = [p for p in prompt_set.prompts if p.chat]
    use_template = chat_template and bool(conversational) and has_chat_template(engine.tokenizer)
    room = engine.max_seq_len - max_new_tokens
    prompts, ids, too_long = [], [], 0
    for prompt in prompt_set.prompts:
        templated = use_template and prompt.chat
        tokens = chat_prompt_ids(engine.tokenizer, prompt.text) if templated else engine.encode(prompt.text)
        if len(tokens) > room:
            too_long += 1
            continue
        prompts.append({"index": len(ids), "category": prompt.category, "prompt_tokens": len(tokens),
                        "preview": prompt.text[:80], "chat_template": templated})
        ids.append(tokens)
    if not ids:
        raise UsageError(f"no prompt of {prompt_set.name!r} fits: each needs at most {room} tokens so that "
                         f"{max_new_tokens} new tokens fit the engine's max_seq_len {engine.max_seq_len}; "
                         f"lower --max-new-tokens or recompile with a larger --max-seq-len")
    notes = [f"{too_long} prompt(s) skipped: longer than {room} tokens (max_seq_len {engine.max_seq_len} "
             f"minus {max_new_tokens} new tokens)"] if too_long else []
    if use_template:
        notes.append(f"{len(conversational)} conversational prompt(s) formatted with the model's chat template "
                     f"(one user turn, generation prompt added; --no-chat-template encodes them as plain text)")
    elif conversational and chat_template:
        notes.append(f"{len(conversational)} conversational prompt(s) encoded as plain text: the model's "
                     f"tokenizer has no chat template")
    return prompts, ids, notes


def quiet_transformers() -> None:
    """Loading bars for every model load would bury the benchmark's own progress bar."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
