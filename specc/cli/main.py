"""`specc compile | run | chat | serve | inspect | methods | bench | distill-data | distill-draft | export`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specc.capture.load import DTYPES
from specc.lower.registry import backend_names
from specc.errors import SpeccError
from specc.quantize.teacher import TEACHERS



class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every option's help (unless unset: None, empty, off), epilogs (examples) as written."""

    def _get_help_string(self, action):
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """--threads/--debug/--verbose, accepted before the verb and after it (a verb's
    copy never overrides a value given before the verb with its own default)."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("--threads", type=int, default=default(None), metavar="N",
                        help="CPU threads for torch; unset: $OMP_NUM_THREADS if set, else the physical cores "
                             "not busy by the 1-minute load average, at most 4 (torch's own all-cores default "
                             "collapses when other jobs share the cores)")
    parser.add_argument("--debug", action="store_true", default=default(False),
                        help="show full tracebacks on errors")
    parser.add_argument("--verbose", action="store_true", default=default(False),
                        help="show informational messages (data files skipped, library progress bars and "
                             "warnings, search details)")


def _verb(verbs, name: str, help: str, examples: str = "", description: str | None = None):
    p = verbs.add_parser(name, help=help, description=description or help, formatter_class=_HelpFormatter,
                         epilog=("examples:\n" + examples) if examples else None)
    return p


def build_parser() -> argparse.ArgumentParser:
    from specc import __version__

    parser = argparse.ArgumentParser(
        prog="specc", formatter_class=_HelpFormatter,
        description="Compile a Hugging Face causal LM into a speculative inference engine, and run it.",
        epilog="examples:\n"
               "  specc compile ./my-model --method METHOD -o engines/m   (methods: specc methods)\n"
               "  specc run engines/m --prompt 'def quicksort(xs):'\n"
               "  specc chat engines/m\n"
               "  specc serve engines/m --port 8000\n"
               "  specc VERB --help      options of one verb")
    parser.add_argument("--version", action="version", version=f"specc {__version__}")
    _global_options(parser, suppress=False)
    verbs = parser.add_subparsers(
        dest="verb", required=True,
        metavar="{compile,run,chat,serve,inspect,methods,bench,distill-data,distill-draft,export}")
    for add in (_add_compile, _add_run, _add_chat, _add_serve, _add_inspect, _add_methods, _add_bench,
                _add_distill_data, _add_distill_draft, _add_export):
        _global_options(add(verbs), suppress=True)
    return parser


def _add_compile(verbs):
    p = _verb(verbs, "compile", "compile a checkpoint into an engine directory",
              "  specc compile ./my-model --method none -o engines/plain\n"
              "  specc compile ./my-model --method METHOD --set KEY=VALUE -o engines/m   (fields: specc methods)\n"
              "  specc compile model.gguf --method METHOD --backend aoti -o engines/m --force\n")
    p.add_argument("model", help="Hugging Face checkpoint directory, a .gguf file, or a hub id already in the "
                                 "local cache")
    p.add_argument("--method", required=True, help="speculative method (see `specc methods`)")
    p.add_argument("-o", "--output", required=True, type=Path, help="engine directory to write")
    p.add_argument("--backend", default="eager", help=f"how the graphs are lowered: {', '.join(backend_names())}")
    p.add_argument("--dtype", default="float32", help=f"weight and cache dtype: {', '.join(DTYPES)}")
    p.add_argument("--max-seq-len", type=int, default=1024, help="longest prompt + generation the engine serves")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="set a method config field (repeatable; see `specc methods`)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--kernels", action="store_true",
                   help="run attention through specc's Triton kernel (specc.kernels; pays off on CUDA only: "
                        "on CPU it computes the PyTorch reference)")
    p.add_argument("--quantize", metavar="SCHEME", default=None,
                   help="quantization of the model's linear layers (CPU, with --dtype bfloat16): q4, q6 or q8 "
                        "(blocks of 32, int8 activations, specc's kernel: the fastest), or weight-only int8 "
                        "(per channel), int4 (groups of 32), int4-g64|g128|g256")
    p.add_argument("--quantize-draft", metavar="SCHEME", default=None,
                   help="quantization of a separate drafting model's linear layers instead of --quantize's (the "
                        "same schemes): a q4 draft beside a bfloat16 target drafts for a fraction of a step, "
                        "and the target still verifies every token")
    p.add_argument("--teacher", choices=TEACHERS, default="unquantized",
                   help="with --quantize: the model training distills from, the checkpoint as given "
                        "(unquantized) or with the weights --quantize packs (quantized)")
    _device_option(p, "the engine will run (training and ahead-of-time lowering run there too)")
    return p


def _device_option(p, what: str) -> None:
    p.add_argument("--device", default="auto", metavar="DEVICE",
                   help=f"where {what}: auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda, cuda:N")


def _sampling_options(p, max_new_tokens: int | None = 64,
                      max_new_tokens_help: str = "most tokens generated (per prompt)") -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N", help=max_new_tokens_help)
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 decodes greedily (token-identical to HF greedy for lossless "
                        "methods)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (with T > 0)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed for sampling (reproducible output)")
    p.add_argument("--stop", action="append", default=[], metavar="STRING",
                   help="end generation where STRING appears; the text is cut before it (repeatable; "
                        "\\n and \\t are a newline and a tab)")
    p.add_argument("--backend", default=None,
                   help="override the engine's backend with one that lowers at load time (eager, inductor); "
                        "default: the engine's own")
    _device_option(p, "the engine runs (an aoti engine: where it was compiled for)")
    _load_settings_option(p)


def _load_settings_option(p) -> None:
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="change a setting the engine's method takes as it loads, without recompiling "
                        "(`specc methods` marks them 'set at load': the lookup branch's, e.g. lookup=true; "
                        "a drafter's depth or stopping rule); repeatable")


def _add_run(verbs):
    p = _verb(verbs, "run", "generate text with an engine",
              "  specc run engines/m --prompt 'def quicksort(xs):' --max-new-tokens 48\n"
              "  specc run engines/m --prompt 'a' --prompt 'b' --json     one JSON object per prompt\n"
              "  specc run engines/m --prompt-file prompt.txt --stop '\\n\\n'\n"
              "  echo 'def f(x):' | specc run engines/m --prompt -\n"
              "  specc run engines/chat --chat --prompt 'What is a monad?'\n")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="prompt text; '-' reads it from stdin; repeat for several prompts, generated one "
                        "after another")
    p.add_argument("--prompt-file", action="append", default=[], type=Path, metavar="FILE",
                   help="read one prompt from FILE (repeatable)")
    _sampling_options(p)
    p.add_argument("--no-stream", action="store_true",
                   help="print the text once generation ends instead of as rounds are accepted")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt (text, token_ids, finish_reason, stats); never streams")
    p.add_argument("--chat", action="store_true",
                   help="send each prompt as one user turn through the model's chat template and print the reply")
    return p


def _add_chat(verbs):
    p = _verb(verbs, "chat", "talk to an engine: an interactive multi-turn chat through the model's chat template",
              "  specc chat engines/smollm2\n"
              "  specc chat engines/smollm2 --system 'Answer in one sentence.' --temperature 0.7 --seed 1\n"
              "  printf 'Hi\\nWhat did I say?\\n' | specc chat engines/smollm2    one turn per input line\n"
              "\nin the chat: /reset starts a new conversation, /exit (or Ctrl-D) leaves; "
              "Ctrl-C stops a reply.\n")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--system", default=None, metavar="TEXT", help="a system message opening the conversation")
    _sampling_options(p, max_new_tokens=None,
                      max_new_tokens_help="most tokens per reply (default: 256, or half the room the engine's "
                                          "max sequence length leaves after the template, if less)")
    p.add_argument("--no-stream", action="store_true", help="print each reply once it is complete")
    _prefix_reuse_option(p, "turn")
    return p


def _add_serve(verbs):
    p = _verb(verbs, "serve", "serve an engine over an OpenAI-compatible HTTP API",
              "  specc serve engines/m --port 8000\n"
              "  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\\n"
              "       -d '{\"prompt\": \"def f(x):\", \"max_tokens\": 32, \"temperature\": 0}'\n"
              "  python -c \"import openai; c = openai.OpenAI(base_url='http://localhost:8000/v1', api_key='-'); "
              "print(c.completions.create(model='m', prompt='def f(x):').choices[0].text)\"\n",
              description="Serve an engine over HTTP: /v1/completions, /v1/chat/completions (both with "
                          "\"stream\": true as server-sent events), /v1/models and /health. Requests run one "
                          "at a time in arrival order (batch 1); more than --max-queue waiting get 503. Needs "
                          "the `serve` extra: pip install 'specc[serve]'.")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument("--model-name", default=None,
                   help="model id reported by /v1/models and in responses; default: the engine directory's name")
    p.add_argument("--max-queue", type=int, default=16, metavar="N",
                   help="requests that may wait behind the running one; more get HTTP 503")
    p.add_argument("--backend", default=None,
                   help="override the engine's backend with one that lowers at load time (eager, inductor)")
    _device_option(p, "the engine runs (an aoti engine: where it was compiled for)")
    _load_settings_option(p)
    _prefix_reuse_option(p, "request")
    return p


def _prefix_reuse_option(p, unit: str) -> None:
    p.add_argument("--no-prefix-reuse", action="store_true",
                   help=f"prefill each {unit}'s whole prompt; by default only what the previous generation did "
                        f"not leave in the KV cache is (methods that cannot resume always prefill whole)")


def _add_methods(verbs):
    return _verb(verbs, "methods", "list methods and their config fields with defaults",
                 "  specc methods\n  specc compile MODEL --method METHOD --set KEY=VALUE -o engines/m\n")


def _add_inspect(verbs):
    p = _verb(verbs, "inspect", "show what the passes did to the graphs",
              "  specc inspect engines/m\n  specc inspect engines/m --graph target\n"
              "  specc inspect engines/m --after insert_kv_cache\n")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--graph", help="print this graph in full")
    p.add_argument("--after", metavar="PASS", help="print the graph right after this pass")
    return p


def _add_bench(verbs):
    p = _verb(verbs, "bench", "measure speed and acceptance against plain decoding",
              "  specc bench engines/m\n  specc bench engines/m --prompts spec_bench --num-prompts 8 --json out.json\n"
              "  specc bench engines/m --baseline llama.cpp --max-new-tokens 128\n"
              "  specc bench engines/m --set lookup=true     the engine with its lookup branch on\n")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--prompts", default="code", help="prompt set name (code, text, spec_bench, gsm8k) or a "
                                                     "JSONL/text file")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per system")
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--json", dest="json_out", type=Path, help="write all figures to this JSON file")
    p.add_argument("--plot", type=Path, help="write a PNG chart")
    p.add_argument("--no-chat-template", action="store_true",
                   help="encode conversational prompts (Spec-Bench turns) as plain text, not chat-formatted")
    p.add_argument("--baseline", action="append", default=[], metavar="SYSTEM",
                   help="also run another engine as a baseline (repeatable): llama.cpp runs the engine's source "
                        "GGUF, plain and with its own n-gram lookup decoding (needs pip install 'specc[peers]')")
    p.add_argument("--gguf", type=Path, metavar="FILE",
                   help="the GGUF file --baseline llama.cpp runs (default: the one the engine was compiled from)")
    _device_option(p, "the engine and its baselines run (an aoti engine: where it was compiled for)")
    _load_settings_option(p)
    return p


def _add_distill_data(verbs):
    p = _verb(verbs, "distill-data", "write training text for the drafters: the model's own replies to prompts",
              "  specc distill-data ./my-model --prompts spec_bench --skip 80 --num-prompts 160 -o calib.jsonl\n"
              "  specc compile ./my-model --method METHOD --set calib_data=calib.jsonl -o engines/m\n",
              description="Generate the model's greedy replies to a prompt set and write each conversation "
                          "(prompt through the chat template where it is conversational, then the reply) as "
                          "one JSONL record with a `text` field: training text for --set calib_data=FILE that "
                          "looks like what the engine will decode. Skip the prompts you benchmark with --skip "
                          "(prompts are taken in `specc bench` order).")
    p.add_argument("model", help="Hugging Face checkpoint directory or .gguf file (as for `specc compile`)")
    p.add_argument("-o", "--output", required=True, type=Path, help="JSONL file to write")
    p.add_argument("--prompts", default="spec_bench",
                   help="prompt set name (spec_bench, gsm8k, code, text, or code-train / text-train: the built-in "
                        "corpus's training split), a JSONL/text file, or self-chat: user turns the model "
                        "writes itself from its chat template, sampled")
    p.add_argument("--skip", type=int, default=0, metavar="N", help="leave out the first N prompts")
    p.add_argument("--seed", type=int, default=0, help="self-chat: seed of the sampled user turns")
    p.add_argument("--max-query-tokens", type=int, default=128, metavar="N",
                   help="self-chat: longest user turn sampled (unfinished ones are dropped)")
    p.add_argument("--num-prompts", type=int, default=128, metavar="N", help="prompts to answer")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="longest reply")
    p.add_argument("--max-prompt-tokens", type=int, default=768, metavar="N",
                   help="skip prompts longer than this")
    p.add_argument("--batch-size", type=int, default=16, metavar="N", help="prompts generated together")
    p.add_argument("--dtype", default="float32", help=f"weight dtype while generating: {', '.join(DTYPES)}")
    p.add_argument("--no-chat-template", action="store_true",
                   help="encode conversational prompts as plain text, not chat-formatted")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    _device_option(p, "the target generates")
    return p


def _add_distill_draft(verbs):
    p = _verb(verbs, "distill-draft", "build a small drafter checkpoint for a target: its first layers, self-distilled",
              "  specc distill-draft ./my-model --layers 4 --calib-data calib.jsonl -o drafts/my-model-l4\n",
              description="Write a Hugging Face checkpoint for the methods that draft with a separate model (their "
                          "draft checkpoint setting; see `specc methods`) when the target has "
                          "no smaller sibling sharing its tokenizer: the target's embedding, first --layers "
                          "decoder layers, final norm and LM head, then the layers and the norm trained to "
                          "match the frozen target's next-token distribution (soft cross-entropy on its top-k). "
                          "The embedding and LM head stay the target's own.")
    p.add_argument("model", help="Hugging Face checkpoint directory or .gguf file (as for `specc compile`)")
    p.add_argument("-o", "--output", required=True, type=Path, help="checkpoint directory to write")
    p.add_argument("--layers", type=int, default=4, metavar="N", help="decoder layers the draft keeps (the first N)")
    p.add_argument("--calib-data", default=None, metavar="FILE",
                   help="training text, as the methods' calib_data: a JSONL file (best: `specc distill-data` "
                        "output, whose held-out figures count replies only) or text file; default: the built-in "
                        "corpus")
    p.add_argument("--train-steps", type=int, default=1000, metavar="N", help="training steps, one window each")
    p.add_argument("--train-windows", type=int, default=256, metavar="N",
                   help="distinct training windows (the target runs once on each)")
    p.add_argument("--seq-len", type=int, default=128, metavar="N", help="tokens per window")
    p.add_argument("--eval-sequences", type=int, default=8, metavar="N",
                   help="held-out windows for the agreement estimate")
    p.add_argument("--teacher-top-k", type=int, default=64, metavar="N",
                   help="target probabilities kept per position (the soft label's top-k)")
    p.add_argument("--learning-rate", type=float, default=1e-3, metavar="LR",
                   help="peak AdamW learning rate (warm-up over 5%% of the steps, then cosine decay): above "
                        "fine-tuning rates, since the kept layers must take over the dropped layers' work (rates "
                        "compared: docs/cli.md, specc distill-draft)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed for the window order (same seed, same weights)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    _device_option(p, "the target teaches and the draft trains")
    return p


def _add_export(verbs):
    from specc.export import FORMATS

    formats = "; ".join(f"{f.name}: {f.help}" for f in FORMATS.values())
    examples = "".join(f"  {line}\n" for f in FORMATS.values() for line in f.examples.splitlines())
    p = _verb(verbs, "export", "write an engine's trained drafter in another runtime's checkpoint layout", examples,
              description=f"Write the trained drafter of an engine as a checkpoint another runtime loads. {formats}.")
    p.add_argument("engine", type=Path, help="engine directory written by `specc compile -o`")
    p.add_argument("--format", required=True, choices=list(FORMATS), help="checkpoint layout to write")
    p.add_argument("-o", "--output", required=True, type=Path, help="directory to write")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty output directory")
    p.add_argument("--target-config", type=Path, default=None, metavar="PATH",
                   help="the target checkpoint's config.json (or its directory), read for RMSNorm epsilon, RoPE and "
                        "context length; default: the engine's source checkpoint")
    return p


def main(argv: list[str] | None = None) -> int:
    from specc.console import interrupts

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.debug or args.verbose else logging.WARNING, format="%(message)s")
    with interrupts.handled():
        try:
            return _dispatch(args)
        except SpeccError as exc:
            if args.debug:
                raise
            print(f"specc: error: {exc}", file=sys.stderr)
            return exc.exit_code
        except (KeyboardInterrupt, interrupts.Terminated) as exc:
            print(interrupts.message(exc), file=sys.stderr)
            return interrupts.exit_code(exc)
        except Exception as exc:
            if args.debug:
                raise
            print(f"specc: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
                  file=sys.stderr)
            return 1


def _dispatch(args) -> int:
    if args.verb == "methods":
        print(_methods_text(), end="")
        return 0
    from specc.host.threads import apply_threads

    apply_threads(args.threads)
    if args.verb in ("compile", "run", "chat", "serve", "bench", "distill-data", "distill-draft"):
        _quiet_libraries(args.verbose or args.debug)
    if args.verb == "compile":
        return _compile(args)
    if args.verb in ("run", "chat"):
        from specc.cli import generation

        return generation.run(args) if args.verb == "run" else generation.chat(args)
    if args.verb == "serve":
        from specc.serve.command import serve

        return serve(args)
    if args.verb == "inspect":
        from specc.engine.inspect_engine import inspect_engine

        print(inspect_engine(args.engine, args.graph, args.after), end="")
        return 0
    if args.verb == "bench":
        from specc.bench.command import run_bench

        return run_bench(args)
    if args.verb == "distill-data":
        return _distill_data(args)
    if args.verb == "distill-draft":
        return _distill_draft(args)
    if args.verb == "export":
        return _export(args)
    raise AssertionError(args.verb)


def _quiet_libraries(verbose: bool) -> None:
    """Keep the stage lines whole: no Hugging Face loading bars or advisory warnings unless --verbose."""
    if verbose:
        return
    import transformers
    from huggingface_hub.utils import disable_progress_bars

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


def _compile(args) -> int:
    from specc.compiler import CompileRequest, compile_engine
    from specc.host.device import resolve_device

    request = CompileRequest(
        model=args.model, method=args.method, output=args.output, backend=args.backend, dtype=args.dtype,
        max_seq_len=args.max_seq_len, force=args.force, settings=args.settings, kernels=args.kernels,
        show_progress=True, device=args.device, quantize=args.quantize, quantize_draft=args.quantize_draft,
        teacher=args.teacher,
    )
    quantized = (f", {args.quantize} weights" if args.quantize else "") + (
        f", {args.quantize_draft} draft weights" if args.quantize_draft else "")
    print(f"compiling {args.model} with method {args.method} ({args.backend}, {args.dtype}{quantized}, "
          f"{resolve_device(args.device)}) ...", file=sys.stderr)
    report = compile_engine(request)
    seconds, training = report["compile_seconds"], report.get("training")
    parts = ([f"training {training['seconds']:.1f}s in {training['dtype']}"] if training else []) + (
        [f"{report['backend']} packaging {seconds['lowering']:.1f}s"] if seconds["lowering"] else [])
    print(f"wrote {args.output} in {seconds['total']:.1f}s" + (f" ({', '.join(parts)})" if parts else ""))
    from specc.quantize.report import describe_reports

    for line in describe_reports(report):
        print(line)
    return 0


def _distill_data(args) -> int:
    from specc.train.self_distill import DistillDataRequest, write_distill_data

    report = write_distill_data(DistillDataRequest(
        model=args.model, prompts=args.prompts, output=args.output, skip=args.skip, num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, max_prompt_tokens=args.max_prompt_tokens,
        chat_template=not args.no_chat_template, dtype=args.dtype, force=args.force, device=args.device,
        seed=args.seed, max_query_tokens=args.max_query_tokens,
    ))
    print(f"wrote {args.output}: {report.summary()}")
    return 0


def _distill_draft(args) -> int:
    from specc.train.draft_distill import DraftDistillRequest, distill_draft

    report = distill_draft(DraftDistillRequest(
        model=args.model, output=args.output, layers=args.layers, calib_data=args.calib_data,
        train_steps=args.train_steps, train_windows=args.train_windows, seq_len=args.seq_len,
        eval_sequences=args.eval_sequences, teacher_top_k=args.teacher_top_k, learning_rate=args.learning_rate,
        seed=args.seed, force=args.force, device=args.device,
    ))
    print(f"wrote {args.output}: {report.summary()}")
    return 0


def _export(args) -> int:
    from specc.export import ExportRequest, export_engine

    report = export_engine(ExportRequest(engine=args.engine, output=args.output, format=args.format,
                                         force=args.force, target_config=args.target_config))
    for warning in report.warnings:
        print(f"specc: warning: {warning}", file=sys.stderr)
    print(f"wrote {args.output}: {report.summary()}")
    return 0


def _methods_text() -> str:
    from specc.contract.descriptor import all_methods

    lines = []
    for method in all_methods():
        kind = ("lossless or lossy by mode" if method.lossless_when is not None
                else "lossless" if method.lossless else "lossy")
        lines.append(f"{method.name} ({kind}): {method.summary}")
        fields = method.config_class.describe_fields()
        if not fields:
            lines.append("    (no config fields)")
        for f in fields:
            allowed = f" ({f['allowed']})" if f["allowed"] else ""
            at_load = " [set at load]" if f["at_load"] else ""
            lines.append(f"    {f['name']}: {f['type']} = {f['default']!r}{allowed}{at_load}  — {f['help']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
