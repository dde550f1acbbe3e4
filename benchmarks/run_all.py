"""Benchmark every registered method on a reference model.

    python benchmarks/run_all.py [--model-spec small] [--quick] [--update-results]

Builds (or reuses from the cache) the reference model, compiles every method
in the registry that it can, runs `specc bench` on each against the same
baselines, and writes benchmarks/results/<device>-<model>.json and .md.
Methods that need a draft model get the `tiny` reference model when its
tokenizer matches the target's; a fetchable pretrained model has no smaller
sibling here, so its draft is a checkpoint you pass with `--draft` (e.g. one
written by `specc distill-draft`). `--quick` uses the tiny model as target and
a few short prompts, for a run of a couple of minutes.

With --update-results, every committed suite's table replaces whatever
benchmarks/RESULTS.md holds between the markers <!-- bench:begin --> and
<!-- bench:end --> (nothing is written if either marker is missing). How to
run the suites: benchmarks/README.md; what the results mean: benchmarks/NOTES.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ENGINES = REPO / "build" / "bench-engines"
DRAFT_SPEC = "tiny"
RESULTS_PAGE = REPO / "benchmarks" / "RESULTS.md"
RESULTS_BEGIN, RESULTS_END = "<!-- bench:begin -->", "<!-- bench:end -->"
SUITE_SCHEMA = "specc-bench-suite/1"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-spec", default="small",
                        help="reference model spec, or a fetchable pretrained model such as smollm2-135m "
                             "(default small)")
    parser.add_argument("--quick", action="store_true", help="tiny model, 4 prompts, 32 new tokens")
    parser.add_argument("--prompts", default="code", help="prompt set or file, as for `specc bench`")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 16 (4 with --quick)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (32 with --quick)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="eager", help="engine backend for every method (default eager)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weight and cache dtype of every engine (default float32); other than float32, "
                             "losslessness is judged against specc's own none engine of that dtype")
    parser.add_argument("--draft", type=Path,
                        help="draft checkpoint for the methods that need one (default: the tiny reference model "
                             "for reference targets, none for fetchable ones)")
    parser.add_argument("--methods", help="comma-separated subset of methods (default: all registered)")
    parser.add_argument("--set", dest="method_settings", action="append", default=[], metavar="METHOD:KEY=VALUE",
                        help="a config field for one method (repeatable); the suite then needs a --tag")
    parser.add_argument("--tag", help="name of a non-default variant: results go to <device>-<model>[-<backend>]-<tag>")
    parser.add_argument("--engines-from", metavar="VARIANT",
                        help="benchmark the engines an earlier suite compiled (build/bench-engines/VARIANT, e.g. "
                             "smollm2-135m-onnx) instead of compiling: the same engines on another prompt set")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--update-results", action="store_true",
                        help="rewrite benchmarks/RESULTS.md between the bench markers with every committed table")
    args = parser.parse_args(argv)
    if args.quick:
        args.model_spec = "tiny"
    args.method_settings = _method_settings(parser, args.method_settings)
    if args.engines_from and args.method_settings:
        parser.error("--engines-from reuses compiled engines: their settings are fixed, --set cannot change them")
    if args.method_settings and not args.tag:
        parser.error("--set changes a method's defaults: name the variant with --tag so its results are not "
                     "mistaken for the defaults'")
    args.num_prompts = args.num_prompts or (4 if args.quick else 16)
    args.max_new_tokens = args.max_new_tokens or (32 if args.quick else 64)
    return args


def _method_settings(parser: argparse.ArgumentParser, assignments: list[str]) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for assignment in assignments:
        method, sep, field = assignment.partition(":")
        if not sep or "=" not in field:
            parser.error(f"--set {assignment}: expected METHOD:KEY=VALUE, e.g. swift:tree_widths=1,2,3,4")
        settings.setdefault(method, []).append(field)
    return settings


def main(argv: list[str] | None = None) -> int:
    from specc.errors import SpeccError

    args = parse_args(argv)
    try:
        return run_suite(args)
    except SpeccError as exc:
        print(f"run_all: error: {exc}", file=sys.stderr)
        return exc.exit_code


def run_suite(args: argparse.Namespace) -> int:
    from specc.bench.machine import DEVICE_USED, device_label, machine_info, versions

    target, draft = source_models(args.model_spec, args.draft)
    engines = ENGINES / (args.engines_from or variant_name(args.model_spec, args.backend, args.tag, args.dtype))
    build = (partial(compile_method, dtype=args.dtype) if not args.engines_from
             else reuse_compiled(args.backend, args.dtype))
    max_seq_len = _max_seq_len(target)
    methods = selected_methods(args.methods)
    unknown = set(args.method_settings) - {m.name for m in methods}
    if unknown:
        print(f"run_all: error: --set names {', '.join(sorted(unknown))}, not among the methods run",
              file=sys.stderr)
        return 2
    baseline = build("none", target, None, engines, args.backend, max_seq_len)
    results = {}
    for method in methods:
        print(f"\n### {method.name}", file=sys.stderr)
        results[method.name] = run_method(method, target, draft, baseline, engines, max_seq_len, args, build)
    suite = {
        "schema": SUITE_SCHEMA, "created_unix": int(time.time()), "device": device_label(DEVICE_USED),
        "model_spec": args.model_spec, "model_checkpoint": str(target),
        "draft_spec": None if draft is None else str(args.draft) if args.draft else DRAFT_SPEC,
        "settings": {"prompts": args.prompts, "num_prompts": args.num_prompts,
                     "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "backend": args.backend,
                     "dtype": args.dtype, "quick": args.quick, "tag": args.tag, "method_settings": args.method_settings,
                     "methods": args.methods, "draft": None if args.draft is None else str(args.draft),
                     "engines_from": args.engines_from},
        "machine": machine_info(), "versions": versions(), "methods": results,
        "omitted": "each method's per-run records (`runs`); `specc bench --json` keeps them",
    }
    stem = results_stem(suite)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stem}.json").write_text(json.dumps(suite, indent=1) + "\n")
    table = markdown_table(suite)
    (args.results_dir / f"{stem}.md").write_text(table)
    print(f"\nwrote {args.results_dir / stem}.json and .md", file=sys.stderr)
    print(table)
    if args.update_results:
        update_results(RESULTS_PAGE, results_section(args.results_dir))
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0


def source_models(model_spec: str, draft: Path | None = None) -> tuple[Path, Path | None]:
    """(target checkpoint, draft checkpoint or None). A fetchable pretrained model has
    no draft unless one is given: no smaller model shares its tokenizer here."""
    from specc.refmodels import build_reference_model
    from specc.refmodels.fetch import FETCHABLE_MODELS, fetch_model

    target = fetch_model(model_spec) if model_spec in FETCHABLE_MODELS else build_reference_model(model_spec)
    if draft is not None or model_spec in FETCHABLE_MODELS:
        return target, draft
    return target, build_reference_model(DRAFT_SPEC)


def variant_name(model_spec: str, backend: str, tag: str | None, dtype: str = "float32") -> str:
    """<model>[-<backend>][-<dtype>][-<tag>], eager and float32 left implicit: names both the results
    and the engines."""
    return "-".join(filter(None, [model_spec, None if backend == "eager" else backend,
                                  None if dtype == "float32" else dtype, tag]))


def results_stem(suite: dict) -> str:
    settings = suite["settings"]
    return (f"{suite['device']}-"
            f"{variant_name(suite['model_spec'], settings['backend'], settings.get('tag'), _dtype(settings))}")


def results_section(results_dir: Path) -> str:
    """Every committed suite's table, by device, then model size (smallest first), then backend."""
    from specc.refmodels import REFERENCE_MODELS
    from specc.refmodels.fetch import FETCHABLE_MODELS

    order = [*FETCHABLE_MODELS, *REFERENCE_MODELS]   # the pretrained models users judge specc on lead
    suites = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    suites = [s for s in suites if s.get("schema") == SUITE_SCHEMA]
    suites.sort(key=lambda s: (s["device"], order.index(s["model_spec"]) if s["model_spec"] in order else len(order),
                               s["settings"]["backend"], s["settings"].get("tag") or ""))
    header = "Committed results (`benchmarks/results/`; rerun with `python benchmarks/run_all.py --update-results`):"
    return "\n".join([header] + ["\n" + markdown_table(s) for s in suites]) + "\n"


def selected_methods(names: str | None) -> list:
    from specc.contract.descriptor import all_methods, get_method

    if not names:
        return all_methods()
    return [get_method(name.strip()) for name in names.split(",") if name.strip()]


def run_method(method, target: Path, draft: Path, baseline: Path, engines: Path, max_seq_len: int, args,
               build=None) -> dict:
    """Compile and benchmark one method; a failure is recorded and the suite goes on."""
    from specc.bench.harness import BenchOptions, benchmark
    from specc.bench.report import format_report, identity_banner

    note = None
    if method.extra_sources and draft is None:
        return {"status": "skipped", "note": "no draft model: no smaller checkpoint shares this model's tokenizer "
                                             "on this machine (none is fetchable); distill one with `specc "
                                             "distill-draft` and pass it with --draft"}
    if method.extra_sources:
        mismatch = vocabulary_mismatch(target, draft)
        if mismatch:
            return {"status": "skipped", "note": f"no usable draft model: {mismatch}"}
        if target.resolve() == draft.resolve():
            note = f"the draft ({draft}) is the target itself: a sanity run, α should be 1"
    try:
        engine = (baseline if method.name == "none" else
                  (build or compile_method)(method.name, target, draft if method.extra_sources else None, engines,
                                 args.backend, max_seq_len, args.method_settings.get(method.name, [])))
        doc = benchmark(BenchOptions(engine=engine, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                                     repeats=args.repeats, num_prompts=args.num_prompts, baseline_engine=baseline))
    except Exception as exc:  # one broken method must not hide the others' results; it is reported loudly
        traceback.print_exc()
        return {"status": "failed", "note": f"{type(exc).__name__}: {exc}"}
    print(format_report(doc))
    banner = identity_banner(doc)
    if banner:
        print(banner, file=sys.stderr)
    doc.pop("runs")
    return {"status": "ok", "note": note, "bench": doc}


def compile_method(name: str, target: Path, draft: Path | None, engines: Path, backend: str,
                   max_seq_len: int, settings: list[str] = (), dtype: str = "float32") -> Path:
    from specc.compiler import CompileRequest, compile_engine
    from specc.contract.descriptor import get_method

    if draft is not None:
        settings = [*settings, *(f"{s.config_field}={draft}" for s in get_method(name).extra_sources)]
    output = engines / name
    output.parent.mkdir(parents=True, exist_ok=True)
    print(f"compiling {name} ({backend}, {dtype}) into {output}", file=sys.stderr)
    compile_engine(CompileRequest(model=str(target), method=name, output=output, backend=backend, dtype=dtype,
                                  max_seq_len=max_seq_len, force=True, settings=list(settings)))
    return output


def reuse_compiled(backend: str, dtype: str = "float32"):
    """A stand-in for `compile_method` that returns the engine an earlier suite compiled."""
    def reuse(name: str, target, draft, engines: Path, *settings) -> Path:
        return compiled_engine(engines, name, backend, dtype)
    return reuse


def compiled_engine(engines: Path, name: str, backend: str, dtype: str = "float32") -> Path:
    """An engine an earlier suite compiled, checked to be there and built for `backend` in `dtype`."""
    from specc.errors import UsageError

    manifest = engines / name / "manifest.json"
    if not manifest.is_file():
        raise UsageError(f"--engines-from: no {name} engine in {engines} (run that suite first)")
    recorded = json.loads(manifest.read_text())
    built_for, built_dtype = recorded.get("backend"), recorded.get("dtype", "float32")
    if built_for != backend:
        raise UsageError(f"--engines-from: {engines / name} was built for {built_for}, not {backend}")
    if built_dtype != dtype:
        raise UsageError(f"--engines-from: {engines / name} holds {built_dtype} weights, not {dtype} "
                         f"(pass --dtype {built_dtype})")
    print(f"reusing {engines / name}", file=sys.stderr)
    return engines / name


def vocabulary_mismatch(target: Path, draft: Path) -> str | None:
    """Why `draft` cannot draft for `target`, or None if their tokenizers agree."""
    from transformers import AutoConfig, AutoTokenizer

    target_vocab = AutoConfig.from_pretrained(target).vocab_size
    draft_vocab = AutoConfig.from_pretrained(draft).vocab_size
    if target_vocab != draft_vocab:
        return f"vocabulary sizes differ ({draft_vocab} in {draft}, {target_vocab} in {target})"
    if AutoTokenizer.from_pretrained(target).get_vocab() != AutoTokenizer.from_pretrained(draft).get_vocab():
        return f"the tokenizers of {draft} and {target} map tokens to different ids"
    return None


def _max_seq_len(checkpoint: Path) -> int:
    from transformers import AutoConfig

    return min(1024, AutoConfig.from_pretrained(checkpoint).max_position_embeddings)


def _dtype(settings: dict) -> str:
    """The engines' dtype; suites recorded before --dtype existed were float32."""
    return settings.get("dtype", "float32")


def _workload_flags(settings: dict) -> str:
    """The prompt flags that differ from the defaults, so the command reproduces the run."""
    if settings.get("quick"):
        return ""
    defaults = {"prompts": "code", "num_prompts": 16, "max_new_tokens": 64, "repeats": 3}
    return "".join(f" --{key.replace('_', '-')} {settings[key]}" for key, default in defaults.items()
                   if settings.get(key, default) != default)


def markdown_table(suite: dict) -> str:
    settings = suite["settings"]
    tag, changed = settings.get("tag"), settings.get("method_settings") or {}
    changes = "; ".join(f"{m}: {', '.join(fields)}" for m, fields in changed.items())
    variant = "" if not tag else f", variant `{tag}`" + (f" ({changes})" if changes else "")
    dtype = _dtype(settings)
    dtype_label, dtype_flag = ("", "") if dtype == "float32" else (f", {dtype}", f" --dtype {dtype}")
    lines = [
        f"**{suite['model_spec']}, {settings['backend']}{dtype_label}, {suite['device']}{variant}.**",
        f"Device `{suite['device']}`, model `{suite['model_spec']}`, backend {settings['backend']}{dtype_label}; "
        f"prompts `{settings['prompts']}` x{settings['num_prompts']}, {settings['max_new_tokens']} new tokens, "
        f"greedy, batch 1; median of {settings['repeats']} interleaved repeats",
        f"(`python benchmarks/run_all.py --model-spec {suite['model_spec']}"
        f"{'' if settings['backend'] == 'eager' else ' --backend ' + settings['backend']}"
        + dtype_flag
        + (f" --methods {settings['methods']}" if settings.get("methods") else "")
        + (f" --draft {settings['draft']}" if settings.get("draft") else "")
        + (f" --engines-from {settings['engines_from']}" if settings.get("engines_from") else "")
        + "".join(f" --set {m}:{field}" for m, fields in changed.items() for field in fields)
        + (f" --tag {tag}" if tag else "") + _workload_flags(settings) +
        f"{' --quick' if settings['quick'] else ''}`).",
        "",
        "| method | lossless | tok/s | × HF greedy | × specc none | × HF prompt lookup | × HF assisted "
        "| M | α per step | α per token | identical to HF | SWIFT eq. 6 | eq. 6, measured verify cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name, result in suite["methods"].items():
        if result["status"] != "ok":
            notes.append(f"- `{name}` {result['status']}: {result['note']}")
            continue
        if result["note"]:
            notes.append(f"- `{name}`: {result['note']}")
        lines.append(_table_row(name, result["bench"]))
    baselines = _baseline_line(suite)
    return "\n".join(lines + ([""] + [baselines] if baselines else []) + ([""] + notes if notes else [])) + "\n"


def _table_row(name: str, doc: dict) -> str:
    overall = doc["overall"]
    engine = overall["systems"]["engine"]
    acceptance = engine.get("acceptance", {})
    identity = doc["identity"]
    eq6 = overall["prediction"]["swift_eq6"]
    predictions = [eq6.get("expected_speedup"), eq6.get("with_measured_verify")]
    rates = [acceptance.get("step_acceptance_rate"), acceptance.get("acceptance_rate")]
    same = (f"{identity['identical']}/{identity['total']}" + (" ⚠" if doc["identity_flag"] else "")
            + (" (vs none)" if identity.get("reference") == "specc-none" else ""))
    cells = [
        f"`{name}`", "yes" if doc["engine"]["lossless"] else "no",
        f"{engine['tokens_per_second']['median']:.1f}",
        *(_speedup_cell(overall["speedup"].get(b)) for b in ("hf-greedy", "specc-none", "hf-prompt-lookup",
                                                              "hf-assisted")),
        f"{acceptance['mean_accepted_length']:.2f}" if acceptance else "—",
        *("—" if rate is None else f"{rate:.2f}" for rate in rates),
        same,
        *("—" if value is None else f"{value:.2f}×" for value in predictions),
    ]
    return "| " + " | ".join(cells) + " |"


def _speedup_cell(spread: dict | None) -> str:
    if spread is None:
        return "—"
    return f"{spread['median']:.2f}× ({spread['min']:.2f}–{spread['max']:.2f})"


def _baseline_line(suite: dict) -> str | None:
    docs = [r["bench"] for r in suite["methods"].values() if r["status"] == "ok"]
    if not docs:
        return None
    systems = docs[0]["overall"]["systems"]
    labels = {s["name"]: s["label"] for s in docs[0]["systems"]}
    parts = [f"{labels[n]} {systems[n]['tokens_per_second']['median']:.1f}" for n in ("hf-greedy", "specc-none")]
    return "Baseline tok/s (from the first method's run): " + ", ".join(parts) + "."


def update_results(page: Path, table: str) -> bool:
    """Replace the text between the bench markers; leave the page alone without them."""
    if not page.is_file():
        print(f"{page} does not exist; not updated", file=sys.stderr)
        return False
    text = page.read_text()
    begin, end = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
    if begin < 0 or end < begin:
        print(f"{page} has no {RESULTS_BEGIN} ... {RESULTS_END} section; not updated", file=sys.stderr)
        return False
    page.write_text(text[: begin + len(RESULTS_BEGIN)] + "\n" + table + text[end:])
    print(f"updated the benchmark tables in {page}", file=sys.stderr)
    return True


if __name__ == "__main__":
    sys.exit(main())
