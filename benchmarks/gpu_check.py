"""The GPU check: SmolLM2-135M-Instruct engines on a CUDA GPU against Hugging Face `generate`
with a static cache, side by side in one process, then specc's CUDA tests.

    python benchmarks/gpu_check.py bench   --group NAME --engines NAME=DIR ... --out DIR [--hf]
                                           [--prompt-ids FILE | --prompt-sets code,spec_bench]
    python benchmarks/gpu_check.py smollm2 --gguf FILE.gguf --out DIR [--budget 480] [--groups ...]
    python benchmarks/gpu_check.py tests   --out DIR [--budget 200] [--select EXPR]
    python benchmarks/gpu_check.py prompt-ids --engine DIR --out DIR

(`--device cpu` rehearses any stage on a CPU.)

`bench` loads engines already built (the headline: engines compiled on a CPU and carried,
benchmarks/gpu_carry.py) and benchmarks them with (`--hf`) HF generate's static cache,
interleaved on the same prompts, one prompt set after the other (default 8 prompts each of
`code` and Spec-Bench chat; `--prompt-ids` reads them as token ids, written beforehand by
`prompt-ids`, so the GPU machine needs neither the shared data nor this Python's standard
library). `smollm2` compiles on the device and works through groups in order of what they
settle, as far as the budget goes (`--groups` picks some): inductor (none, prompt-lookup,
against HF), kangaroo, kernels (`none` with `--kernels`), eagle (each beside the inductor
`none`), aoti (none, prompt-lookup, kangaroo): per group it compiles the bfloat16 engines for
`cuda` while the budget leaves room for the group's benchmark (`bench_reserve`), then runs
`bench` in a process of its own. `tests` runs `pytest -m gpu`. Every step writes its JSON and
Markdown as it goes, so a run cut short still reports what finished; logs go to `DIR/logs/`,
every process runs with `-X faulthandler`, so a crash leaves its Python stack in the log.
benchmarks/gpu_check.sh is the wrapper that runs them on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path



@dataclass(frozen=True)
class Group:
    """Engines compiled, then benchmarked in a process of their own; `flags` go to every compile
    of the group, and `beside` names engines of earlier groups benchmarked with it."""

    name: str
    backend: str
    methods: tuple[str, ...]
    flags: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()

    def engine(self, method: str) -> str:
        return f"{method}{''.join('+' + f.lstrip('-') for f in self.flags)}-{self.backend}"


GROUPS = (
    # the headline first: none and prompt-lookup against HF generate, measured before anything trains
    Group("inductor", "inductor", ("none", "prompt-lookup")),
    # Kangaroo trains (about a minute on an H100) and compiles graphs of its own at load
    Group("kangaroo", "inductor", ("kangaroo",), beside=("none-inductor",)),
    # specc's Triton attention against the library's, side by side (the kernels issue)
    Group("kernels", "inductor", ("none",), flags=("--kernels",), beside=("none-inductor",)),
    # eagle trains on the GPU before it compiles: its own group, after the cheaper ones
    Group("eagle", "inductor", ("eagle",), beside=("none-inductor",)),
    Group("aoti", "aoti", ("none", "prompt-lookup", "kangaroo")),
)
HF_GROUP = "inductor"   # the group whose benchmark also runs HF generate (dynamic and static cache)
MAX_SEQ_LEN = 1024
# What a group's benchmark process needs (estimates from the H100 run in
# benchmarks/results/gpu-h100-smollm2-135m-bfloat16-gpu-check-2026-11-27.md): Inductor compiles a
# new engine's graphs at load, an engine whose graphs are already in Inductor's cache loads
# quickly, HF's static cache compiles itself, and the timed runs come last.
LOAD_S = {"inductor": 85, "aoti": 30}
CACHED_LOAD_S = 15
HF_S = 120
RUNS_S = 40
STATIC_HF_NEEDS_S = 150   # the benchmark skips HF's static cache with less time than this left


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("tests", "smollm2", "bench", "prompt-ids"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gguf", type=Path)
    parser.add_argument("--budget", type=float, default=None, help="seconds this stage may take")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set")
    parser.add_argument("--prompt-sets", default="code,spec_bench", help="bench: comma-separated prompt sets")
    parser.add_argument("--prompt-ids", type=Path, help="bench: JSON of each set's prompt token ids, "
                                                         "instead of --prompt-sets")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--group", help="bench: the backend group's name")
    parser.add_argument("--engines", nargs="*", default=[], help="bench: NAME=DIR of each engine")
    parser.add_argument("--hf", action="store_true", help="bench: also run HF generate")
    parser.add_argument("--groups", help="smollm2: comma-separated group names, in the order given "
                                         f"(default: {','.join(g.name for g in GROUPS)})")
    parser.add_argument("--select", help="tests: pytest -k expression")
    parser.add_argument("--engine", type=Path, help="prompt-ids: the engine whose tokenizer encodes the prompts")
    args = parser.parse_args(argv)
    if args.stage == "prompt-ids":
        return write_prompt_ids(args)
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    if args.stage == "tests":
        return run_tests(args.out, args.budget or 200, args.select)
    if args.stage == "bench":
        return run_bench_group(args)
    return run_smollm2(args, args.budget or 480)


def write_prompt_ids(args) -> int:
    """`--out`/prompt-ids.json: each set's prompts as token ids, encoded here, so that the GPU
    machine (no shared data, another Python's standard library) decodes the very same prompts."""
    from specc.engine.loaded import load_engine

    engine = load_engine(args.engine, backend="eager", device="cpu")
    ids = prompt_sets_from(args.prompt_sets.split(","), args.prompts, args.max_new_tokens)(engine)
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "prompt-ids.json", ids)
    print(f"gpu_check: {', '.join(f'{len(v)} {k}' for k, v in ids.items())} prompts in {args.out / 'prompt-ids.json'}")
    return 0


def run_tests(out: Path, budget: float, select: str | None = None) -> int:
    command = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu",
               "-vv", "-rs", "--durations=0", "tests/gpu", *(["-k", select] if select else [])]
    code, seconds = _logged(command, out / "logs" / "pytest-gpu.log", budget)
    _write(out / "pytest-gpu.json", {"command": " ".join(command), "returncode": code, "seconds": seconds})
    return code


def run_smollm2(args, budget: float) -> int:
    """Per backend group: compile its engines while the budget leaves room for its benchmark,
    then benchmark them in a separate process (a crash there loses only that group)."""
    if args.gguf is None or not args.gguf.exists():
        print(f"gpu_check: --gguf {args.gguf} does not exist", file=sys.stderr)
        return 2
    try:
        groups = select_groups(args.groups)
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    report = {"compiles": [], "bench": {}}
    built: dict[str, Path] = {}
    for group in groups:
        compiled = [f"{name}={built[name]}" for name in group.beside if name in built]
        tried = {step["engine"] for step in report["compiles"]}   # failed or skipped: not tried again
        for count, (owner, method) in enumerate(engines_to_compile(group, tried), start=1):
            name = owner.engine(method)
            left = budget - (time.perf_counter() - start) - bench_reserve(group, count)
            if left < 30:
                report["compiles"].append({"engine": name, "skipped": f"budget: {left:.0f} s left for compiling"})
                continue
            output = args.out / "engines" / name
            command = [sys.executable, "-X", "faulthandler", "-m", "specc.cli.main", "compile", str(args.gguf),
                       "--method", method, "--backend", owner.backend, "--dtype", "bfloat16", "--device", args.device,
                       "--max-seq-len", str(MAX_SEQ_LEN), *owner.flags, "-o", str(output), "--force"]
            code, seconds = _logged(command, args.out / "logs" / f"compile-{name}.log", left)
            report["compiles"].append({"engine": name, "returncode": code, "seconds": round(seconds, 1)})
            if code == 0:
                compiled.append(f"{name}={output}")
                built[name] = output
            print(f"gpu_check: compile {name}: rc {code} in {seconds:.0f} s", flush=True)
            _write(args.out / "gpu-check.json", report)
        left = budget - (time.perf_counter() - start)
        if any(name in built for name in map(group.engine, group.methods)) and left > 60:
            command = [sys.executable, "-X", "faulthandler", __file__, "bench", "--out", str(args.out),
                       "--group", group.name, "--device", args.device, "--prompts", str(args.prompts),
                       "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats),
                       "--budget", str(round(left)), "--prompt-sets", args.prompt_sets,
                       *(["--prompt-ids", str(args.prompt_ids)] if args.prompt_ids else []),
                       "--engines", *compiled, *(["--hf"] if group.name == HF_GROUP else [])]
            code, seconds = _logged(command, args.out / "logs" / f"bench-{group.name}.log", left)
            result = args.out / f"bench-{group.name}.json"
            outcome = json.loads(result.read_text()) if result.is_file() else {}
            if code != 0 or "cuda_graphs" not in outcome:   # what it measured before it stopped stays in the report
                outcome["error"] = f"rc {code} after {seconds:.0f} s; see logs/bench-{group.name}.log"
            report["bench"][group.name] = outcome
            print(f"gpu_check: bench {group.name}: rc {code} in {seconds:.0f} s", flush=True)
        _write(args.out / "gpu-check.json", report)
    report["seconds"] = round(time.perf_counter() - start, 1)
    _write(args.out / "gpu-check.json", report)
    (args.out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    ok = all(step.get("returncode", 0) == 0 for step in report["compiles"])
    return 0 if ok and report["bench"] and all("error" not in b for b in report["bench"].values()) else 1


def select_groups(names: str | None) -> list[Group]:
    if not names:
        return list(GROUPS)
    by_name = {group.name: group for group in GROUPS}
    unknown = [name for name in names.split(",") if name not in by_name]
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(unknown)}; the groups are {', '.join(by_name)}")
    return [by_name[name] for name in names.split(",")]


def engines_to_compile(group: Group, tried: set[str]) -> list[tuple[Group, str]]:
    """(group that defines it, method) of each engine the group's benchmark needs: the engines
    it is measured beside that no earlier group tried to compile, then its own."""
    owners = {owner.engine(method): (owner, method) for owner in GROUPS for method in owner.methods}
    return [owners[name] for name in group.beside if name not in tried] + [(group, m) for m in group.methods]


def bench_reserve(group: Group, engines: int) -> float:
    """Seconds the group's benchmark needs with its first `engines` engines compiled: the first
    engine of a backend compiles at load; the rest of the group and the engines beside it
    usually share its graphs or find them in Inductor's cache."""
    loads = LOAD_S[group.backend] + CACHED_LOAD_S * (engines - 1 + len(group.beside))
    return loads + RUNS_S + (HF_S if group.name == HF_GROUP else 0)


def run_bench_group(args) -> int:
    compiled = [(name, Path(path)) for name, path in (item.split("=", 1) for item in args.engines)]
    if args.prompt_ids:
        prompt_sets = {name: ids[:args.prompts] for name, ids in json.loads(args.prompt_ids.read_text()).items()}
    else:
        prompt_sets = prompt_sets_from(args.prompt_sets.split(","), args.prompts, args.max_new_tokens)
    path = args.out / f"bench-{args.group}.json"

    def save(partial: dict) -> None:
        _write(path, partial)
        (args.out / f"bench-{args.group}.md").write_text("\n".join(bench_markdown(args.group, partial)) + "\n")

    result = bench(compiled, prompt_sets, args.max_new_tokens, args.repeats, args.device, args.hf,
                   deadline=time.perf_counter() + (args.budget or 1e9), progress=save)
    save(result)
    return 0


def bench(compiled: list[tuple[str, Path]], prompt_sets, max_new_tokens: int, repeats: int,
          device: str, with_hf: bool, deadline: float = float("inf"), progress=lambda partial: None) -> dict:
    """The engines and (`with_hf`) HF generate with a static cache, interleaved, on each prompt
    set in turn: `prompt_sets` maps a set's name to its prompts' token ids, or is a callable
    that makes that map from the first engine loaded. `progress` gets what is known so far after
    each load and each set; HF's static cache, which compiles itself, is left out when less than
    `STATIC_HF_NEEDS_S` remain before `deadline`."""
    import torch

    from specc.bench.machine import versions
    from specc.bench.memory import MemoryProbe
    from specc.bench.runner import run_interleaved
    from specc.bench.systems import engine_system, hf_system
    from specc.capture.load import load_model
    from specc.engine.loaded import load_engine

    engines, load_seconds, notes = {}, {}, []
    report = {"dtype": "bfloat16", "max_new_tokens": max_new_tokens, "repeats": repeats,
              "load_seconds": load_seconds, "notes": notes, "sets": {}}
    for name, path in compiled:
        start = time.perf_counter()
        try:
            engines[name] = load_engine(path, device=device)
        except Exception as exc:   # noqa: BLE001 - one engine that does not load leaves the others measurable
            load_seconds[name] = f"load failed: {type(exc).__name__}: {exc}"[:2000]
            continue
        load_seconds[name] = round(time.perf_counter() - start, 1)
        print(f"gpu_check: loaded {name} in {load_seconds[name]} s", flush=True)
        progress(report)
    first = next(iter(engines.values()))
    report |= {"device": torch.cuda.get_device_name(0) if first.device.type == "cuda" else "cpu",
               "versions": versions()}
    prompt_ids = prompt_sets(first) if callable(prompt_sets) else prompt_sets
    systems = []
    if with_hf:
        model = load_model(Path(first.manifest["source_checkpoint"]), "bfloat16").to(device)
        static = hf_system("hf-static-cache", "HF generate, static cache", model, max_new_tokens,
                           cache_implementation="static")
        if deadline - time.perf_counter() < STATIC_HF_NEEDS_S:
            notes.append(f"HF static cache left out: less than {STATIC_HF_NEEDS_S} s of the budget left")
        else:
            try:
                start = time.perf_counter()
                static.generate(next(iter(prompt_ids.values()))[0])   # compiles itself on the first call
                systems.append(static)
                load_seconds["hf-static-cache"] = round(time.perf_counter() - start, 1)
            except Exception as exc:   # noqa: BLE001
                notes.append(f"HF static cache failed: {type(exc).__name__}: {exc}"[:2000])
        progress(report)
    systems += [engine_system(name, f"specc {name}", "engine", engine, max_new_tokens)
                for name, engine in engines.items()]
    for set_name, ids in prompt_ids.items():
        start = time.perf_counter()
        runs = run_interleaved(systems, ids, repeats, MemoryProbe(), show_progress=False)
        report["sets"][set_name] = {"prompts": len(ids), "seconds": round(time.perf_counter() - start, 1),
                                    "systems": summarize(runs, [s.name for s in systems], len(ids)),
                                    "runs": [r.to_json() for r in runs]}
        print(f"gpu_check: benchmarked the {set_name} prompts in {report['sets'][set_name]['seconds']} s", flush=True)
        progress(report)
    report["cuda_graphs"] = {name: {g: {"replays": cg.replays, "captured_shapes": len(cg.graphs),
                                        "uncapturable_shapes": len(cg.uncapturable)}
                                    for g, cg in engine.cuda_graphs.items()}
                             for name, engine in engines.items()}
    return report


def prompt_sets_from(names: list[str], count: int, max_new_tokens: int):
    """A `bench` prompt-set maker: the first `count` prompts of each named set, encoded (chat
    prompts through the chat template) by the first engine loaded."""
    def encode(engine) -> dict[str, list[list[int]]]:
        from specc.bench.harness import encode_fitting
        from specc.data.prompts import load_prompt_set

        return {name: encode_fitting(engine, load_prompt_set(name, count), max_new_tokens)[1] for name in names}
    return encode


def summarize(runs, names: list[str], prompts: int) -> dict:
    """Per system: tokens/s per repeat (median, min, max), speedups over specc none of the same
    backend and over HF static, mean accepted length, acceptance, identity with specc none."""
    by_system = {name: [r for r in runs if r.system == name] for name in names}
    result = {}
    for name, mine in by_system.items():
        per_repeat = {}
        for run in mine:
            tokens, seconds = per_repeat.get(run.repeat, (0, 0.0))
            per_repeat[run.repeat] = (tokens + len(run.token_ids), seconds + run.seconds)
        rates = [t / s for t, s in per_repeat.values()]
        entry = {"tokens_per_second": {"median": round(statistics.median(rates), 1), "min": round(min(rates), 1),
                                       "max": round(max(rates), 1)}}
        stats = [r.stats for r in mine if r.stats is not None]
        if stats:
            forwards = sum(s.target_forward_passes for s in stats)
            drafted = sum(s.drafted_tokens for s in stats)
            entry["mean_accepted_length"] = round(sum(len(r.token_ids) for r in mine) / max(forwards, 1), 3)
            entry["acceptance_rate"] = round(sum(s.accepted_tokens for s in stats) / drafted, 3) if drafted else None
        result[name] = entry
    for name, entry in result.items():
        backend = name.rsplit("-", 1)[-1]
        none = f"none-{backend}"
        if none in result and name != none:
            entry["speedup_over_none"] = round(entry["tokens_per_second"]["median"]
                                               / result[none]["tokens_per_second"]["median"], 3)
            entry["identical_to_none"] = _identical(by_system[name], by_system[none], prompts)
        if "hf-static-cache" in result and name != "hf-static-cache":
            entry["speedup_over_hf_static"] = round(entry["tokens_per_second"]["median"]
                                                    / result["hf-static-cache"]["tokens_per_second"]["median"], 3)
    return result


def _identical(mine, reference, prompts: int) -> str:
    want = {r.prompt_index: r.token_ids for r in reference if r.repeat == 0}
    got = {r.prompt_index: r.token_ids for r in mine if r.repeat == 0}
    return f"{sum(got[i] == want[i] for i in want if i in got)}/{prompts}"


def markdown(report: dict) -> str:
    lines = ["# GPU check: SmolLM2-135M-Instruct, bfloat16", ""]
    for step in report["compiles"]:
        lines.append(f"- compile {step['engine']}: " + (step.get("skipped") or
                                                        f"rc {step['returncode']}, {step['seconds']} s"))
    for group, bench in report["bench"].items():
        lines += ["", *bench_markdown(group, bench)]
    return "\n".join(lines) + "\n"


def bench_markdown(group: str, bench: dict) -> list[str]:
    lines = [f"## {group}", ""]
    if "error" in bench:
        lines.append(f"benchmark stopped: {bench['error']}")
    lines.append(f"{bench.get('device', 'device not reached')}; torch {bench.get('versions', {}).get('torch')}; "
                 f"{bench.get('max_new_tokens')} new tokens, greedy, batch 1, {bench.get('repeats')} interleaved "
                 f"repeats; load seconds {bench.get('load_seconds', {})}")
    for set_name, result in bench.get("sets", {}).items():
        lines += ["", f"### {result['prompts']} `{set_name}` prompts", "",
                  "| system | tok/s median [min-max] | vs specc none | vs HF static | mean accepted length | "
                  "acceptance | identical to none |", "|---|---|---|---|---|---|---|"]
        for name, entry in result["systems"].items():
            tps = entry["tokens_per_second"]
            lines.append(f"| {name} | {tps['median']} [{tps['min']}-{tps['max']}] | "
                         + " | ".join(_cell(entry.get(key)) for key in ("speedup_over_none", "speedup_over_hf_static",
                                                                         "mean_accepted_length", "acceptance_rate",
                                                                         "identical_to_none")) + " |")
    lines += [f"- note: {note}" for note in bench.get("notes", [])]
    return lines


def _cell(value) -> str:
    return "—" if value is None else str(value)


def _logged(command: list[str], log: Path, budget: float) -> tuple[int, float]:
    start = time.perf_counter()
    with log.open("w") as sink:
        try:
            code = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=max(budget, 1)).returncode
        except subprocess.TimeoutExpired:
            sink.write(f"\ngpu_check: timed out after {budget:.0f} s\n")
            code = 124
    return code, time.perf_counter() - start


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
