"""Compare the lowering backends on one model: the `none` engine per backend, one run.

    python benchmarks/compare_backends.py [--model-spec tiny] [--backends eager,inductor,aoti,onnx]

Compiles the autoregressive `none` engine of the model once per backend
(under build/bench-engines/<model>-backends/<backend>; an engine already
there is reused unless --recompile, or unless it was compiled from another
checkpoint, dtype or max_seq_len), then loads every engine and Hugging Face
greedy decoding into this one process and times them interleaved on the same
prompts with `specc bench`'s machinery (prompt sets, chat formatting, one
warm-up per system, runs rotated per prompt and repeat, throughput per
repeat, medians with min–max). Every engine's output is checked token by
token against HF greedy. Per backend it reports tok/s, the speedup over HF
greedy and over the eager engine, the compile time and artifact size
recorded in the engine's manifest, and the seconds this process took to
load the engine. Results go to
benchmarks/results/<device>-<model>-backends.{json,md}.

--model-spec takes a reference model spec, a fetchable pretrained model
(smollm2-135m) or a checkpoint directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "specc-bench-backends/1"
DEFAULT_BACKENDS = ("eager", "inductor", "aoti", "onnx")
EAGER = "eager"
DEFAULTS = {"prompts": "code", "num_prompts": 16, "max_new_tokens": 64, "repeats": 3}


def _run_all():
    """benchmarks/run_all.py, for its paths and helpers (this file may be loaded by path, so no plain import)."""
    spec = importlib.util.spec_from_file_location("specc_run_all", Path(__file__).with_name("run_all.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_all = _run_all()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-spec", default="tiny",
                        help="reference model spec, fetchable pretrained model (smollm2-135m) or checkpoint "
                             "directory (default tiny)")
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                        help=f"comma-separated backends (default {','.join(DEFAULT_BACKENDS)})")
    parser.add_argument("--prompts", default=DEFAULTS["prompts"], help="prompt set or file, as for `specc bench`")
    parser.add_argument("--num-prompts", type=int, default=DEFAULTS["num_prompts"])
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"])
    parser.add_argument("--repeats", type=int, default=DEFAULTS["repeats"])
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="engines' max_seq_len (default: the model's, at most 1024, as run_all)")
    parser.add_argument("--recompile", action="store_true", help="recompile engines even if they exist")
    parser.add_argument("--engines-dir", type=Path, default=None,
                        help="where the engines go (default build/bench-engines/<model>-backends)")
    parser.add_argument("--results-dir", type=Path, default=run_all.RESULTS)
    args = parser.parse_args(argv)
    args.backends = list(dict.fromkeys(b.strip() for b in args.backends.split(",") if b.strip()))
    if not args.backends:
        parser.error("--backends names no backend")
    return args


def main(argv: list[str] | None = None) -> int:
    from specc.errors import SpeccError

    args = parse_args(argv)
    try:
        return compare(args)
    except SpeccError as exc:
        print(f"compare_backends: error: {exc}", file=sys.stderr)
        return exc.exit_code


def compare(args: argparse.Namespace) -> int:
    from specc.bench.harness import quiet_transformers
    from specc.bench.machine import DEVICE_USED, device_label, machine_info, versions
    from specc.errors import UsageError
    from specc.lower.registry import get_backend

    if args.max_new_tokens < 1 or args.repeats < 1:
        raise UsageError("--max-new-tokens and --repeats must be at least 1")
    quiet_transformers()   # a loading bar per model load would bury the progress lines
    model_name, checkpoint = resolve_model(args.model_spec)
    max_seq_len = args.max_seq_len or run_all._max_seq_len(checkpoint)
    engines_dir = args.engines_dir or run_all.ENGINES / f"{model_name}-backends"
    backends: dict[str, dict] = {}
    paths: dict[str, Path] = {}
    for backend in args.backends:
        print(f"\n### {backend}: none engine", file=sys.stderr)
        try:
            get_backend(backend).check_available()
        except UsageError as exc:   # unknown, or a package or device this machine lacks
            backends[backend] = {"status": "skipped", "note": str(exc)}
            print(f"{backend} skipped: {exc}", file=sys.stderr)
            continue
        try:
            paths[backend], backends[backend] = ensure_engine(backend, checkpoint, engines_dir / backend,
                                                              max_seq_len, args.recompile)
        except Exception as exc:   # one backend failing must not hide the others; reported loudly
            traceback.print_exc()
            backends[backend] = {"status": "failed", "note": f"{type(exc).__name__}: {exc}"}
    timing = time_backends(paths, backends, checkpoint, args) if paths else {}
    suite = {
        "schema": SCHEMA, "created_unix": int(time.time()), "device": device_label(DEVICE_USED),
        "model_spec": model_name, "model_argument": args.model_spec, "model_checkpoint": str(checkpoint),
        "settings": {"prompts": args.prompts, "num_prompts": args.num_prompts,
                     "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                     "max_seq_len": max_seq_len, "max_seq_len_given": args.max_seq_len is not None,
                     "backends": args.backends, "method": "none", "dtype": "float32",
                     "decoding": "greedy, batch 1", "warmup_runs_per_system": 1, "interleaved": True},
        "machine": machine_info(), "versions": versions(), **timing, "backends": backends,
    }
    stem = f"{suite['device']}-{model_name}-backends"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stem}.json").write_text(json.dumps(suite, indent=1) + "\n")
    table = markdown_table(suite)
    (args.results_dir / f"{stem}.md").write_text(table)
    print(f"\nwrote {args.results_dir / stem}.json and .md", file=sys.stderr)
    print(table)
    for backend, result in backends.items():
        identity = result.get("identity_vs_hf_greedy")
        if identity and identity["identical"] < identity["total"]:
            print(f"!! {backend}: the lossless none engine matches HF greedy on only {identity['identical']}/"
                  f"{identity['total']} prompts (first differences: {identity['mismatches'][:8]})", file=sys.stderr)
    return 1 if any(b["status"] == "failed" for b in backends.values()) else 0


def resolve_model(model_spec: str) -> tuple[str, Path]:
    """(name for the results, checkpoint directory); only the target: no draft is needed."""
    from specc.refmodels import build_reference_model
    from specc.refmodels.fetch import FETCHABLE_MODELS, fetch_model

    if model_spec in FETCHABLE_MODELS:
        return model_spec, fetch_model(model_spec)
    path = Path(model_spec)
    if (path / "config.json").is_file():
        return path.resolve().name, path.resolve()
    return model_spec, build_reference_model(model_spec)


def ensure_engine(backend: str, checkpoint: Path, output: Path, max_seq_len: int,
                  recompile: bool) -> tuple[Path, dict]:
    """The `none` engine for `backend` at `output`, compiled unless a matching one is there."""
    from specc.compiler import CompileRequest, compile_engine

    wanted = {"method": "none", "backend": backend, "source_checkpoint": str(checkpoint), "dtype": "float32",
              "max_seq_len": max_seq_len}
    reason = "--recompile" if recompile else _stale(output, wanted)
    if reason is None:
        print(f"reusing {output}", file=sys.stderr)
    else:
        print(f"compiling none ({backend}) into {output} ({reason})", file=sys.stderr)
        output.parent.mkdir(parents=True, exist_ok=True)
        compile_engine(CompileRequest(model=str(checkpoint), method="none", output=output, backend=backend,
                                      max_seq_len=max_seq_len, force=True, show_progress=True))
    manifest = json.loads((output / "manifest.json").read_text())
    return output, {"status": "ok", "engine": str(output), "compiled_in_this_run": reason is not None,
                    **compile_figures(manifest), "engine_bytes": _tree_bytes(output)}


def _stale(output: Path, wanted: dict) -> str | None:
    """Why the engine at `output` must be (re)compiled, or None to reuse it."""
    from specc.engine.verify import read_verified_manifest

    if not output.exists():
        return "missing"
    try:
        manifest = read_verified_manifest(output)
    except Exception as exc:
        return f"unusable: {exc}"
    differs = [key for key, value in wanted.items() if manifest.get(key) != value]
    return f"{', '.join(differs)} differ" if differs else None


def compile_figures(manifest: dict) -> dict:
    """Compile seconds and ahead-of-time artifacts, as the manifest recorded them at compile time."""
    seconds = manifest.get("compile_seconds", {})
    lowered = manifest.get("lowered", {})
    return {"compile_seconds": seconds.get("total"), "lowering_seconds": seconds.get("lowering"),
            "artifact_bytes": sum(size for entry in lowered.values() for size in entry["files"].values()),
            "artifacts": {graph: entry["files"] for graph, entry in lowered.items()}}


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def time_backends(paths: dict[str, Path], backends: dict[str, dict], checkpoint: Path, args) -> dict:
    """Load HF greedy and every engine, run them interleaved, and fill in each backend's figures."""
    from specc.bench import statistics as st
    from specc.bench.baselines import source_checkpoint
    from specc.bench.document import memory_summary
    from specc.bench.harness import MIN_REPEATS_FOR_SPREAD, encode_fitting
    from specc.bench.memory import MemoryProbe
    from specc.data.prompts import load_prompt_set
    from specc.bench.runner import run_interleaved
    from specc.bench.systems import HF_GREEDY, engine_system, hf_system
    from specc.capture.load import load_model
    from specc.engine.loaded import load_engine

    engines = {}
    for backend, path in paths.items():
        print(f"loading the {backend} engine", file=sys.stderr)
        start = time.perf_counter()
        try:
            engine = load_engine(path)
        except Exception as exc:
            traceback.print_exc()
            backends[backend] = {**backends[backend], "status": "failed", "note": f"{type(exc).__name__}: {exc}"}
            continue
        backends[backend]["load_seconds"] = round(time.perf_counter() - start, 3)
        backends[backend]["load_compile_seconds"] = round(engine.compile_seconds, 3)   # lazy compile (inductor)
        engines[backend] = engine
    if not engines:
        return {}
    first = next(iter(engines.values()))
    model = load_model(source_checkpoint(first.manifest), first.manifest["dtype"])
    prompt_set = load_prompt_set(args.prompts, args.num_prompts)
    prompts, prompt_ids, notes = encode_fitting(first, prompt_set, args.max_new_tokens)
    notes = prompt_set.notes + notes
    if args.repeats < MIN_REPEATS_FOR_SPREAD:
        notes.append(f"only {args.repeats} repeat(s): the median, min and max are not a spread; "
                     f"use --repeats {MIN_REPEATS_FOR_SPREAD} or more for reportable figures")
    systems = [hf_system(HF_GREEDY, "HF generate, greedy", model, args.max_new_tokens)]
    systems += [engine_system(backend, f"specc none ({backend})", "engine", engine, args.max_new_tokens)
                for backend, engine in engines.items()]
    memory = MemoryProbe()
    print(f"timing {len(systems)} systems on {len(prompt_ids)} prompts x {args.repeats} repeat(s)", file=sys.stderr)
    runs = run_interleaved(systems, prompt_ids, args.repeats, memory)
    indices = set(range(len(prompt_ids)))
    reference = {r.prompt_index: r.token_ids for r in runs if r.system == HF_GREEDY and r.repeat == 0}
    throughput = {s.name: st.throughput_by_repeat(runs, s.name, indices) for s in systems}
    for backend in engines:
        decode = st.decode_throughput_by_repeat(runs, backend, indices)
        backends[backend].update({
            "tokens_per_second": st.spread(throughput[backend]).to_json(),
            "decode_tokens_per_second": st.spread(decode).to_json() if decode else None,
            "speedup_over_hf_greedy": st.speedup(throughput[backend], throughput[HF_GREEDY]).to_json(),
            "speedup_over_eager": (st.speedup(throughput[backend], throughput[EAGER]).to_json()
                                   if EAGER in engines else None),
            "identity_vs_hf_greedy": st.identity(reference, runs, backend),
            "new_tokens_per_repeat": sum(len(r.token_ids) for r in runs if r.system == backend and r.repeat == 0),
        })
    return {"prompts": prompts, "notes": notes,
            "hf_greedy": {"tokens_per_second": st.spread(throughput[HF_GREEDY]).to_json(),
                          "new_tokens_per_repeat": sum(len(t) for t in reference.values())},
            "systems": [s.describe() for s in systems], "memory": memory_summary(runs, systems, memory)}


def command(suite: dict) -> str:
    """The command line that reproduces the run (flags that differ from the defaults)."""
    settings = suite["settings"]
    flags = [f"--model-spec {suite.get('model_argument', suite['model_spec'])}"]
    if settings["backends"] != list(DEFAULT_BACKENDS):
        flags.append(f"--backends {','.join(settings['backends'])}")
    flags += [f"--{key.replace('_', '-')} {settings[key]}" for key, default in DEFAULTS.items()
              if settings[key] != default]
    if settings.get("max_seq_len_given"):
        flags.append(f"--max-seq-len {settings['max_seq_len']}")
    return "OMP_NUM_THREADS=1 python benchmarks/compare_backends.py " + " ".join(flags)


def markdown_table(suite: dict) -> str:
    settings = suite["settings"]
    threads = suite["machine"].get("torch_threads")
    lines = [
        f"**{suite['model_spec']}, backends, {suite['device']}.** The `none` (autoregressive) engine compiled "
        f"with each backend ({settings['dtype']}, max_seq_len {settings['max_seq_len']}), timed in one process "
        f"with HF greedy, interleaved on the same prompts: `{settings['prompts']}` x{settings['num_prompts']}, "
        f"{settings['max_new_tokens']} new tokens, greedy, batch 1, {threads} torch thread(s); median "
        f"(min–max) over {settings['repeats']} repeat(s) (`{command(suite)}`).",
        "",
        "| backend | tok/s | × HF greedy | × eager engine | decode tok/s | identical to HF | compile s "
        "(lowering) | artifacts MB | engine MB | load s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for backend, result in suite["backends"].items():
        if result["status"] != "ok":
            notes.append(f"- `{backend}` {result['status']}: {result['note']}")
            continue
        lines.append(_row(backend, result))
    if "hf_greedy" in suite:
        notes.insert(0, f"- HF generate, greedy: {_tps(suite['hf_greedy']['tokens_per_second'])} tok/s.")
    notes.append("- compile s: `specc compile` wall time (its ahead-of-time lowering in brackets), from each "
                 "engine's manifest, i.e. measured when the engine was compiled; artifacts: the files the "
                 "backend wrote into `compiled/` (they hold the weights again: aoti's .pt2, onnx's .onnx); "
                 "engine MB: the whole engine directory; load s: `load_engine` in this run, Inductor's "
                 "just-in-time compilation (JIT) included, with Inductor's on-disk cache as it was.")
    notes += [f"- {note}" for note in suite.get("notes", [])]
    return "\n".join(lines + [""] + notes) + "\n"


def _row(backend: str, result: dict) -> str:
    identity = result["identity_vs_hf_greedy"]
    same = f"{identity['identical']}/{identity['total']}" + ("" if identity["identical"] == identity["total"]
                                                             else " ⚠")
    decode = result.get("decode_tokens_per_second")
    cells = [
        f"`{backend}`", _tps(result["tokens_per_second"]),
        run_all._speedup_cell(result["speedup_over_hf_greedy"]), run_all._speedup_cell(result["speedup_over_eager"]),
        "—" if decode is None else f"{decode['median']:.1f}", same,
        _seconds(result["compile_seconds"]) + (f" ({_seconds(result['lowering_seconds'])})"
                                               if result["artifacts"] else ""),
        f"{result['artifact_bytes'] / 1e6:.1f}" if result["artifacts"] else "—",
        f"{result['engine_bytes'] / 1e6:.1f}", _load_cell(result),
    ]
    return "| " + " | ".join(cells) + " |"


def _load_cell(result: dict) -> str:
    jit = result.get("load_compile_seconds") or 0.0
    return f"{result['load_seconds']:.2f}" + (f" (JIT {jit:.2f})" if jit > 0 else "")


def _tps(spread: dict) -> str:
    return f"{spread['median']:.1f} ({spread['min']:.1f}–{spread['max']:.1f})"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
