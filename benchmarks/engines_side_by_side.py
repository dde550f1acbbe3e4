"""Several compiled engines of one model, side by side in one process, against the first.

    python benchmarks/engines_side_by_side.py build/q15/none build/q15/prompt-lookup build/q15/draft-model \
        build/q15/kangaroo build/q15/kangaroo@lookup=true \
        --prompts code --num-prompts 8 --max-new-tokens 128 --repeats 2 --name qwen2.5-coder-1.5b

An engine written `DIR@KEY=VALUE[@KEY=VALUE...]` loads with those lookup branch
settings changed (`specc run --set`), so one compiled engine runs with and
without its lookup branch.

`specc bench` measures one engine against Hugging Face's `generate` and the
`none` engine; on a real-size model on the CPU each of those baselines costs
as much time as the engine itself. This script runs only specc engines: the
first (normally `none`, same dtype and backend) is the reference, and every
engine decodes the same prompts greedily, interleaved (one warm-up each, then
the systems in rotated order per prompt and repeat, as `specc bench` does).
It reports, per engine, tokens per second (median over repeats, new tokens /
wall seconds over the prompts), the speedup over the reference, the mean
accepted length M (new tokens per target forward, prefill and bonus token
included), the acceptance rate α, and token identity with the reference; for
every drafting engine, SWIFT's eq. 6 account (a draft step's and a round's
verification cost in reference decode steps, and the decode speedup they
predict); and
the bandwidth bound on the reference's decoding (the bytes its target graph
reads per step, weights and the cached keys and values its steps attended to,
at the read rate sampled between repeats, as `specc bench` reports it) with
the share of it the reference reaches.
Results go to benchmarks/results/<device>-<name>-<prompts>-<tokens>tok.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", nargs="+", help="engine directories, each optionally followed by "
                                                   "@KEY=VALUE load-time settings; the first is the reference")
    parser.add_argument("--prompts", default="code", help="prompt set or file, as for `specc bench`")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", required=True, help="the model's name in the results file name")
    parser.add_argument("--baseline", choices=["llama.cpp"], action="append", default=[],
                        help="also run llama.cpp on the first engine's source GGUF, plain and with its prompt lookup "
                             "(specc bench --baseline llama.cpp; needs pip install 'specc[peers]')")
    parser.add_argument("--gguf", type=Path, help="the GGUF llama.cpp runs (default: the first engine's source)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from specc.bench.bandwidth import BandwidthSamples
    from specc.bench.harness import encode_fitting, quiet_transformers
    from specc.bench.machine import device_label, machine_info, versions
    from specc.bench.memory import MemoryProbe
    from specc.bench.runner import run_interleaved
    from specc.bench.systems import engine_system
    from specc.data.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.host.threads import apply_threads

    args = parse_args(argv)
    threads = apply_threads()
    quiet_transformers()
    engines = load_engines(map(engine_and_settings, args.engines), load_engine)
    peers = _peers(args, engines[0], threads)
    prompt_set = load_prompt_set(args.prompts, args.num_prompts)
    prompts, prompt_ids, notes = encode_fitting(engines[0], prompt_set, args.max_new_tokens)
    names = [_system_name(engine, index) for index, engine in enumerate(engines)]
    systems = [engine_system(name, f"specc {engine.manifest['method']}", "engine", engine, args.max_new_tokens)
               for name, engine in zip(names, engines)]
    systems += peers
    names += [peer.name for peer in peers]
    bandwidth = BandwidthSamples()
    runs = run_interleaved(systems, prompt_ids, args.repeats, MemoryProbe(), show_progress=True,
                           between_repeats=bandwidth)
    summary = summarize(runs, names, len(prompt_ids))
    accounts = eq6_accounts(runs, names)
    doc = {"schema": "specc-side-by-side/1", "model": args.name, "machine": machine_info(), "versions": versions(),
           "settings": {"prompt_set": prompt_set.name, "num_prompts": len(prompt_ids),
                        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                        "decoding": "greedy, batch 1", "interleaved": True},
           "engines": {name: {"path": str(engine.path), "method": engine.manifest["method"],
                              "method_config": engine.config.to_json(),
                              "backend": engine.manifest["backend"], "dtype": engine.manifest["dtype"],
                              "quantization": engine.manifest.get("quantization"),
                              "draft_quantization": engine.manifest.get("draft_quantization"),
                              "teacher": (engine.manifest.get("training") or {}).get("teacher"),
                              "compile_seconds": engine.manifest.get("compile_seconds")}
                       for name, engine in zip(names, engines)},
           "peers": {peer.name: peer.describe() for peer in peers},
           "prompts": prompts, "notes": prompt_set.notes + notes, "summary": summary, "eq6": accounts,
           "bandwidth_bound": reference_bound(engines[0], bandwidth, runs, names[0], prompt_ids),
           "runs": [run.to_json() for run in runs]}
    stem = f"{device_label()}-{args.name}-{prompt_set.name}-{args.max_new_tokens}tok"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    (args.results_dir / f"{stem}.md").write_text(table)
    print(table)
    return 0


def _peers(args, reference, threads: int) -> list:
    """llama.cpp's systems on the reference engine's source GGUF, when asked for."""
    if not args.baseline:
        return []
    from specc.bench.llama_cpp import llama_cpp_systems, source_gguf

    gguf = source_gguf(reference.manifest, args.gguf)
    return llama_cpp_systems(gguf, threads, args.max_new_tokens, reference.max_seq_len)


def reference_bound(reference, bandwidth, runs, name: str, prompt_ids: list[list[int]]) -> dict:
    """The bandwidth bound on the reference engine's decode steps (its weights and the cached keys
    and values its steps attended to), and the share its decoding reaches."""
    from specc.bench.bandwidth import cache_layout, decode_read_bytes, kv_cache_read_bytes
    from specc.bench.statistics import decode_throughput_by_repeat, spread
    from specc.contract.descriptor import TARGET

    cache = kv_cache_read_bytes(cache_layout(reference.context, TARGET), runs, name, prompt_ids)
    bound = bandwidth.bound(decode_read_bytes(reference.context.modules[TARGET]), cache)
    decode = decode_throughput_by_repeat(runs, name, set(range(len(prompt_ids))))
    median = spread(decode).median if decode else None
    share = (lambda tokens_per_second: median / tokens_per_second if median else None)
    return {**bound, "reference_decode_tokens_per_second": median,
            "reference_share_of_bound": share(bound["bound_tokens_per_second"]),
            "reference_share_of_weights_only_bound": share(bound["weights_only_bound_tokens_per_second"])}


def load_engines(paths_and_settings, load) -> list:
    """Each engine, loaded once per directory: further settings of one directory are variants
    sharing its graphs and weights (`LoadedEngine.with_settings`), not another copy in memory."""
    loaded, engines = {}, []
    for path, settings in paths_and_settings:
        if path not in loaded:
            loaded[path] = load(path)
        engines.append(loaded[path].with_settings(settings) if settings else loaded[path])
    return engines


def engine_and_settings(argument: str) -> tuple[Path, list[str]]:
    """`DIR@KEY=VALUE@...` as the directory and its load-time settings."""
    path, *settings = argument.split("@")
    if any("=" not in setting for setting in settings):   # an @ that is part of the directory's name
        return Path(argument), []
    return Path(path), settings


def _system_name(engine, index: int) -> str:
    lookup = "-lookup" if engine.config.to_json().get("lookup") else ""
    return f"{index}-{engine.manifest['method']}{lookup}"


def summarize(runs, names: list[str], prompts: int) -> dict:
    """Per system: tok/s per repeat (median, min, max), speedup over the first, M, α, identity with the first."""
    reference = {r.prompt_index: r.token_ids for r in runs if r.system == names[0] and r.repeat == 0}
    rates = {name: _rates(runs, name) for name in names}
    out = {}
    for name in names:
        mine = [r for r in runs if r.system == name]
        stats = [r.stats for r in mine if r.stats is not None]   # llama.cpp reports none
        forwards = sum(s.target_forward_passes for s in stats)
        drafted = sum(s.drafted_tokens for s in stats)
        identical = sum(r.token_ids == reference[r.prompt_index] for r in mine if r.repeat == 0)
        speedups = [mine_rate / base for mine_rate, base in zip(rates[name], rates[names[0]])]
        out[name] = {"tokens_per_second": _spread(rates[name]), "speedup": _spread(speedups),
                     "mean_accepted_length": sum(s.new_tokens for s in stats) / forwards if forwards else None,
                     "acceptance_rate": sum(s.accepted_tokens for s in stats) / drafted if drafted else None,
                     "identical_to_reference": f"{identical}/{prompts}"}
    return out


def eq6_accounts(runs, names: list[str]) -> dict:
    """SWIFT eq. 6 per drafting engine (`specc.bench.predict`): its M, α, draft cost per step c and
    verification cost per round v, both in the reference's decode steps, and the decode speedup
    they predict, to set beside the measured (end-to-end) one."""
    from specc.bench.predict import predict

    def stats(name):
        return [r.stats for r in runs if r.system == name and r.stats is not None]

    reference = stats(names[0])
    accounts = {}
    for name in names[1:]:
        mine = stats(name)
        if mine and sum(s.draft_steps for s in mine):
            accounts[name] = predict(mine, reference, None)["swift_eq6"]
    return accounts


def _rates(runs, name: str) -> list[float]:
    repeats = sorted({r.repeat for r in runs if r.system == name})
    return [sum(len(r.token_ids) for r in runs if r.system == name and r.repeat == k)
            / sum(r.seconds for r in runs if r.system == name and r.repeat == k) for k in repeats]


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _figure(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(doc: dict) -> str:
    settings = doc["settings"]
    machine = doc["machine"]
    lines = [f"# {doc['model']}: specc engines side by side ({settings['prompt_set']})", "",
             f"{settings['num_prompts']} prompts x {settings['max_new_tokens']} new tokens, {settings['repeats']} "
             f"interleaved repeat(s) after one warm-up each, greedy, batch 1; {machine['processor']}, "
             f"{machine['torch_threads']} torch thread(s); torch {doc['versions']['torch']}. The first engine is "
             f"the reference: speedup and identity are against it (`benchmarks/engines_side_by_side.py`).", "",
             "| engine | backend, dtype | tok/s (median, min-max) | speedup | M | α | identical |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in doc["summary"].items():
        rate, speedup = row["tokens_per_second"], row["speedup"]
        if name in doc.get("peers", {}):
            peer = doc["peers"][name]
            lines.append(f"| {peer['label']} | {Path(peer['config']['gguf']).name} | {rate['median']:.2f} "
                         f"({rate['min']:.2f}-{rate['max']:.2f}) | {speedup['median']:.2f}x | — | — | "
                         f"{row['identical_to_reference']} (agreement) |")
            continue
        engine = doc["engines"][name]
        alpha = "—" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.3f}"
        settings_text = ", ".join(f"{k}={v}" for k, v in engine["method_config"].items()
                                  if k not in ("draft_model", "calib_data", "version") and v not in (None, "", 0))
        weights = f", {engine['quantization']['scheme']} weights" if engine.get("quantization") else ""
        weights += f", {engine['draft_quantization']['scheme']} drafts" if engine.get("draft_quantization") else ""
        weights += f", teacher with {engine['teacher']}" if engine.get("teacher") else ""
        lines.append(f"| {engine['method']}{f' ({settings_text})' if settings_text else ''} | {engine['backend']}, "
                     f"{engine['dtype']}{weights} | {rate['median']:.2f} ({rate['min']:.2f}-{rate['max']:.2f}) | "
                     f"{speedup['median']:.2f}x | {_figure(row['mean_accepted_length'])} | {alpha} | "
                     f"{row['identical_to_reference']} |")
    lines += _eq6_lines(doc.get("eq6", {}), doc["summary"])
    lines += ["", _bound_line(doc["bandwidth_bound"])] + [f"note: {note}" for note in doc["notes"]]
    return "\n".join(lines) + "\n"


def _eq6_lines(accounts: dict, summary: dict) -> list[str]:
    if not accounts:
        return []
    lines = ["", "SWIFT eq. 6 per drafting engine, in the reference's decode steps: c a draft step's cost, v a "
                 "round's verification; E = M·α / ((M − 1)·c + α) predicts the decode speedup, E_v with v in place "
                 "of 1 (the measured speedup above is end to end, prefill included):", "",
             "| engine | M | α | c | v | E | E_v | measured |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, account in accounts.items():
        measured = summary[name]["speedup"]["median"]
        lines.append(f"| {name} | {account['M']:.2f} | {account['alpha']:.3f} | {account['c']:.3f} | "
                     f"{_figure(account.get('v'))} | {_times(account.get('expected_speedup'))} | "
                     f"{_times(account.get('with_measured_verify'))} | {measured:.2f}x |")
    return lines


def _times(value) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _bound_line(bound: dict) -> str:
    from specc.bench.report import bound_line

    return bound_line(bound, "the reference", bound["reference_decode_tokens_per_second"],
                      bound["reference_share_of_bound"],
                      weights_only_share=bound.get("reference_share_of_weights_only_bound"))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
