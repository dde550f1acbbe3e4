"""Where a quantized engine's decode step goes: in specc's kernels, between them, and outside the graph.

    python benchmarks/step_profile.py build/smol/none-q4 --prompts code --num-prompts 2 --max-new-tokens 64

The engine's target graph decodes the prompts greedily (its `none` loop: one row a step,
whatever the engine's method), with specc's CPU operators timing each of their calls
(`specc.kernels.call_trace`) and the graph's package timed around each call. For every
one-row step after the prefill it splits the time from the end of the previous step to the
end of this one into: the quantized matmuls (activation quantizing included), the decoder
chains (`fuse_decoder_chain`), row attention, the gaps between those calls inside the graph (the graph's other kernels, and the
calls themselves), the graph's entry and exit (before its first traced call and after its
last), and the decoding loop outside the graph (Python). Medians over the steps, in µs per
token; engines without specc's CPU operators have nothing to trace. Timed steps run a little
slower than untimed ones (two clock reads a call).
With `--name NAME` the report is also written to benchmarks/results/<device>-NAME-step-profile.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PARTS = ("matmul", "chain", "attention", "gaps", "entry_exit", "outside")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--prompts", default="code", help="prompt set or file, as for `specc bench`")
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--name", help="the results file's name (default: none written)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = profile(args.engine, args.prompts, args.num_prompts, args.max_new_tokens)
    print(format_table(report))
    if args.name:
        from specc.bench.machine import device_label

        args.results_dir.mkdir(parents=True, exist_ok=True)
        path = args.results_dir / f"{device_label()}-{args.name}-step-profile.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


def profile(engine_dir: Path, prompts: str, num_prompts: int, max_new_tokens: int) -> dict:
    from specc.bench.harness import encode_fitting, quiet_transformers
    from specc.data.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.host.threads import apply_threads
    from specc.kernels.call_trace import calls_traced, traced_calls
    from specc.runtime.generate import generate
    from specc.runtime.sampling import SamplingConfig

    threads = apply_threads()
    quiet_transformers()
    engine = load_engine(engine_dir)
    _, prompt_ids, _ = encode_fitting(engine, load_prompt_set(prompts, num_prompts), max_new_tokens)
    model = engine.context.model("target")
    spans: list[tuple[int, int]] = []
    model.forward_fn = _timed(model.forward_fn, spans)
    generate(model, None, prompt_ids[0], 4, SamplingConfig(), model.max_seq_len)   # warm-up
    steps = []
    for ids in prompt_ids:
        spans.clear()
        with calls_traced():
            generate(model, None, ids, max_new_tokens, SamplingConfig(), model.max_seq_len)
            calls = traced_calls()
        steps += split_steps(spans, calls)
    return {"engine": str(engine_dir), "method": engine.manifest["method"], "threads": threads,
            "prompts": prompts, "num_prompts": len(prompt_ids), "max_new_tokens": max_new_tokens,
            "steps": len(steps), "median_us": _medians(steps)}


def _timed(forward, spans: list):
    def timed(*args):
        start = time.perf_counter_ns()
        outputs = forward(*args)
        spans.append((start, time.perf_counter_ns()))
        return outputs
    return timed


def split_steps(spans: list[tuple[int, int]], calls: list) -> list[dict]:
    """Each graph call after the first (the prefill), split into `PARTS` in µs: its traced
    calls, the gaps between them, the time before its first and after its last, and the
    time since the previous graph call ended."""
    steps = []
    for (_, previous_end), (start, end) in zip(spans, spans[1:]):
        inside = [call for call in calls if start <= call.start_ns and call.end_ns <= end]
        if not inside:
            continue
        gaps = sum(b.start_ns - a.end_ns for a, b in zip(inside, inside[1:]))
        steps.append({
            "matmul": _spent(inside, "matmul"), "chain": _spent(inside, "chain"), "attention": _spent(inside, "attention"),
            "gaps": gaps / 1e3,
            "entry_exit": (inside[0].start_ns - start + end - inside[-1].end_ns) / 1e3,
            "outside": (start - previous_end) / 1e3, "token": (end - previous_end) / 1e3, "calls": len(inside)})
    return steps


def _spent(calls: list, kind: str) -> float:
    return sum(call.end_ns - call.start_ns for call in calls if call.kind == kind) / 1e3


def _medians(steps: list[dict]) -> dict:
    keys = (*PARTS, "token", "calls")
    return {key: round(statistics.median(step[key] for step in steps), 1) for key in keys} if steps else {}


def format_table(report: dict) -> str:
    medians = report["median_us"]
    if not medians:
        return f"{report['engine']}: no call into specc's CPU operators was recorded (not a quantized CPU engine?)"
    lines = [f"{report['engine']} ({report['method']}, {report['threads']} threads): {report['steps']} one-row steps, "
             f"median µs per token", "", "| " + " | ".join((*PARTS, "token", "calls a step")) + " |",
             "|" + " --- |" * (len(PARTS) + 2),
             "| " + " | ".join(f"{medians[key]:g}" for key in (*PARTS, "token", "calls")) + " |"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
