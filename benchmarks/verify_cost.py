"""What a forward of q rows costs against one row, per engine: the verification cost v.

A speculative round pays one target forward over the draft's rows; how that
forward's time grows with the row count decides how long a draft can pay.
For each engine, the target graph runs a causal chunk of q rows after
`--prefix` cached tokens, for every q in `--rows`, interleaved across
engines and repeated; the report gives the median milliseconds and the
ratio to q = 1 of the same engine, under each engine's generation threads.

    python benchmarks/verify_cost.py ENGINE [ENGINE ...] [--graph target] [--prefix 300]
        [--rows 1,2,4,8,12] [--repeats 15] [--device auto] [--output FILE.json]

On a GPU each timed call ends with a device synchronisation, so the time is the call's.
`--bound` also samples the machine's read rate between repeats (`specc.bench.bandwidth`)
and reports each engine's one-row call against the bandwidth bound on the bytes its graph
reads (the call alone: no decoding loop, no prefill).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engines", type=Path, nargs="+")
    parser.add_argument("--graph", default="target", help="which graph of each engine to time")
    parser.add_argument("--prefix", type=int, default=300, help="cached tokens before the rows")
    parser.add_argument("--rows", default="1,2,4,8,12", help="comma-separated row counts q")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default=None, help="auto (default), cpu, cuda, cuda:N")
    parser.add_argument("--bound", action="store_true", help="also the one-row call's share of the bandwidth bound")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    rows = sorted({int(q) for q in args.rows.split(",")} | {1})
    report = measure(args.engines, args.graph, args.prefix, rows, args.repeats, args.device, args.bound)
    print(format_table(report))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def measure(engine_dirs: list[Path], graph: str, prefix: int, rows: list[int], repeats: int,
            device: str | None = None, bound: bool = False) -> dict:
    from specc.bench.bandwidth import BandwidthSamples, decode_read_bytes
    from specc.engine.loaded import load_engine
    from specc.errors import UsageError

    engines = [load_engine(path, device=device) for path in engine_dirs]
    models = []
    for path, engine in zip(engine_dirs, engines):
        if graph not in engine.context.graphs:
            raise UsageError(f"{path} has no graph {graph!r} (it has {', '.join(sorted(engine.context.graphs))})")
        if prefix + max(rows) > engine.max_seq_len:
            raise UsageError(f"--prefix {prefix} plus {max(rows)} rows exceeds {path}'s max_seq_len "
                             f"{engine.max_seq_len}")
        models.append(engine.context.model(graph))
    generator = torch.Generator().manual_seed(0)
    vocab = min(m.architecture.vocab_size for m in models)
    context = torch.randint(vocab, (prefix + max(rows),), generator=generator)
    times = {(e, q): [] for e in range(len(engines)) for q in rows}
    read_rate = BandwidthSamples()
    with torch.inference_mode():
        for model, engine in zip(models, engines):
            with engine.generation_scope():
                model.prefill(context[:prefix], 0)
                for q in rows:   # warm every shape once; every row's logits, as a verification
                    model.run_chunk(context[prefix:prefix + q], prefix)
        for _ in range(repeats):
            for e, (model, engine) in enumerate(zip(models, engines)):
                with engine.generation_scope():
                    for q in rows:
                        start = time.perf_counter()
                        model.run_chunk(context[prefix:prefix + q], prefix)
                        _synchronize(engine.device)
                        times[e, q].append(time.perf_counter() - start)
            if bound:
                read_rate()
    results = []
    for e, path in enumerate(engine_dirs):
        one = statistics.median(times[e, 1])
        results.append({"engine": str(path), "backend": engines[e].manifest["backend"],
                        "method": engines[e].manifest["method"],
                        "rows": {str(q): {"ms": round(1000 * statistics.median(times[e, q]), 2),
                                          "ratio": round(statistics.median(times[e, q]) / one, 3)}
                                 for q in rows}})
        if bound:
            limit = read_rate.bound(decode_read_bytes(engines[e].context.modules[graph]))
            results[-1]["bound"] = {**limit, "share_of_bound": round(1 / (limit["bound_tokens_per_second"] * one), 3)}
    return {"graph": graph, "prefix": prefix, "repeats": repeats, "threads": torch.get_num_threads(),
            "device": str(engines[0].device), "engines": results}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_table(report: dict) -> str:
    rows = list(report["engines"][0]["rows"])
    head = "| engine | backend | " + " | ".join(f"q={q}" for q in rows) + " |"
    lines = [head, "|" + "---|" * (2 + len(rows))]
    for entry in report["engines"]:
        cells = [f"{entry['rows'][q]['ms']} ms ({entry['rows'][q]['ratio']}×)" for q in rows]
        lines.append(f"| `{entry['engine']}` | {entry['backend']} | " + " | ".join(cells) + " |")
    for entry in report["engines"]:
        if "bound" in entry:
            limit = entry["bound"]
            lines.append(f"{entry['engine']}: one row {entry['rows']['1']['ms']} ms, bound "
                         f"{1000 / limit['bound_tokens_per_second']:.2f} ms ({limit['weight_bytes_per_token'] / 1e6:.0f} MB "
                         f"at {limit['read_bytes_per_second'] / 1e9:.1f} GB/s): {limit['share_of_bound']:.0%} of the bound")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
