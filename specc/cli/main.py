"""`specc compile | run | inspect | methods | bench`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from specc.capture.load import DTYPES
from specc.engine.format import BACKENDS
from specc.errors import SpeccError



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specc", description="Compile a Hugging Face causal LM into a "
                                     "speculative inference engine, and run it.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads for torch (default: torch's choice; use 1 when other jobs share "
                             "the cores, oversubscription slows small models many times over)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{compile,run,inspect,methods,bench}")
    _add_compile(verbs)
    _add_run(verbs)
    _add_inspect(verbs)
    verbs.add_parser("methods", help="list methods and their config fields with defaults")
    _add_bench(verbs)
    return parser


def _add_compile(verbs) -> None:
    p = verbs.add_parser("compile", help="compile a checkpoint into an engine directory")
    p.add_argument("model", help="Hugging Face checkpoint directory (or a hub id already in the local cache)")
    p.add_argument("--method", required=True, help="speculative method (see `specc methods`)")
    p.add_argument("-o", "--output", required=True, type=Path, help="engine directory to write")
    p.add_argument("--backend", default="eager", help=f"one of {', '.join(BACKENDS)} (default eager)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)")
    p.add_argument("--max-seq-len", type=int, default=1024, help="longest prompt + generation (default 1024)")
    p.add_argument("--draft-model", help="draft checkpoint directory (method draft-model)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="set a method config field (repeatable; see `specc methods`)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")


def _add_run(verbs) -> None:
    p = verbs.add_parser("run", help="generate text with an engine")
    p.add_argument("engine", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--backend", default=None, help="override the engine's backend (eager or inductor)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")


def _add_inspect(verbs) -> None:
    p = verbs.add_parser("inspect", help="show what the passes did to the graphs")
    p.add_argument("engine", type=Path)
    p.add_argument("--graph", help="print this graph in full")
    p.add_argument("--after", metavar="PASS", help="print the graph right after this pass")


def _add_bench(verbs) -> None:
    p = verbs.add_parser("bench", help="measure speed and acceptance against plain decoding")
    p.add_argument("engine", type=Path)
    p.add_argument("--prompts", default="code", help="prompt set name or a JSONL/text file")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--json", dest="json_out", type=Path, help="write all figures to this JSON file")
    p.add_argument("--plot", type=Path, help="write a PNG chart")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.debug else logging.WARNING, format="%(message)s")
    try:
        return _dispatch(args)
    except SpeccError as exc:
        if args.debug:
            raise
        print(f"specc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("specc: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"specc: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
              file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    if args.threads is not None:
        _set_threads(args.threads)
    if args.verb == "compile":
        return _compile(args)
    if args.verb == "run":
        return _run(args)
    if args.verb == "inspect":
        from specc.inspect_engine import inspect_engine

        print(inspect_engine(args.engine, args.graph, args.after), end="")
        return 0
    if args.verb == "methods":
        print(_methods_text(), end="")
        return 0
    if args.verb == "bench":
        from specc.bench.command import run_bench

        return run_bench(args)
    raise AssertionError(args.verb)


def _set_threads(threads: int) -> None:
    from specc.errors import UsageError

    if threads < 1:
        raise UsageError(f"--threads {threads} must be at least 1")
    import torch

    torch.set_num_threads(threads)


def _compile(args) -> int:
    from specc.compiler import CompileRequest, compile_engine

    request = CompileRequest(
        model=args.model, method=args.method, output=args.output, backend=args.backend, dtype=args.dtype,
        max_seq_len=args.max_seq_len, force=args.force, settings=args.settings, draft_model=args.draft_model,
        show_progress=True,
    )
    print(f"compiling {args.model} with method {args.method} ({args.backend}, {args.dtype}) ...", file=sys.stderr)
    report = compile_engine(request)
    seconds = report["compile_seconds"]
    print(f"wrote {args.output} in {seconds['total']:.1f}s"
          + (f" (AOTInductor packaging {seconds['lowering']:.1f}s)" if report["backend"] == "aoti" else ""))
    return 0


def _run(args) -> int:
    from specc.engine.loaded import load_engine
    from specc.runtime.generate import check_lengths
    from specc.runtime.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    if not args.prompt:
        from specc.errors import UsageError

        raise UsageError("the prompt is empty; pass some text with --prompt")
    engine = load_engine(args.engine, args.backend)
    prompt_ids = engine.encode(args.prompt)
    check_lengths(len(prompt_ids), args.max_new_tokens, engine.max_seq_len)
    result = engine.generate_ids(prompt_ids, args.max_new_tokens, sampling)
    text = engine.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    if args.json:
        stats = result.stats.to_json()
        stats["compile_seconds"] = round(engine.compile_seconds, 3)
        print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": stats}))
    else:
        print(args.prompt + text)
        s = result.stats
        rate = "n/a" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
        print(f"[{s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, mean accepted length "
              f"{s.mean_accepted_length:.2f}, acceptance {rate}]", file=sys.stderr)
    return 0


def _methods_text() -> str:
    from specc.methods.descriptor import all_methods

    lines = []
    for method in all_methods():
        kind = "lossless" if method.lossless else "lossy"
        lines.append(f"{method.name} ({kind}): {method.summary}")
        fields = method.config_class.describe_fields()
        if not fields:
            lines.append("    (no config fields)")
        for f in fields:
            lines.append(f"    {f['name']}: {f['type']} = {f['default']!r}  — {f['help']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
