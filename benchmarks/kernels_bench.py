"""specc's kernels against the library on verification shapes: time, error, row invariance.

    python benchmarks/kernels_bench.py [--out DIR] [--quick]      # on a CUDA GPU
    python benchmarks/kernels_bench.py --smoke --out DIR          # the script itself, on the CPU

For every (model shape, dtype, kv, q): `torch.ops.specc.tree_attention` against
`F.scaled_dot_product_attention` with the same boolean mask (default dispatch, and the
math backend), as the median of `triton.testing.do_bench`; the kernel's and SDPA's max
abs error against a float64 reference; and whether row 0 of a q-row call is bitwise the
row of a 1-row call (row invariance: what lets a bfloat16 verification match a decode
step). The mask is a verification's: every live prefix key, then a causal block over the
q new rows. Also: a 2,048-slot cache holding 300 live tokens against a 300-slot cache
(what attention over the empty part of a cache costs), and `greedy_accept` (16 nodes x
49,152 vocabulary) against its reference. Writes `kernels-bench.json` and
`kernels-bench.md` under `--out` (default `$OUT`, else the current directory).
`--smoke` runs a few tiny shapes on the CPU through Triton's interpreter, to test the
script; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

MODELS = {"smollm2-135m": (9, 3, 64), "llama-7b-like": (32, 8, 128)}   # query heads, kv heads, head_dim
KV = (256, 1024, 2048, 4096, 8192)
ROWS = (1, 4, 16, 64)
DTYPES = ("bfloat16", "float16")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--quick", action="store_true", help="kv 256, 1024, 4096 and q 1, 16, 64 only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton's interpreter)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton
    import torch

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("kernels_bench: needs a CUDA GPU (or --smoke on the CPU)", file=sys.stderr)
        return 2
    plan = _plan(args)
    report = run(plan, device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels-bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "kernels-bench.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def _plan(args) -> dict:
    if args.smoke:
        return {"models": {"tiny": (4, 2, 16)}, "kv": (24,), "rows": (1, 3), "dtypes": ("float32",),
                "live": (24, 8), "vocab": 64, "nodes": 4}
    kv, rows = ((256, 1024, 4096), (1, 16, 64)) if args.quick else (KV, ROWS)
    return {"models": MODELS, "kv": kv, "rows": rows, "dtypes": DTYPES, "live": (2048, 300), "vocab": 49152,
            "nodes": 16}


def run(plan: dict, device: str) -> dict:
    import torch

    start = time.perf_counter()
    rows = []
    for model, (heads, kv_heads, head_dim) in plan["models"].items():
        for dtype_name in plan["dtypes"]:
            dtype = getattr(torch, dtype_name)
            for kv in plan["kv"]:
                for q in plan["rows"]:
                    rows.append({"model": model, "dtype": dtype_name, "kv": kv, "q": q,
                                 **attention_case(heads, kv_heads, head_dim, kv, q, kv, dtype, device)})
    slots, live = plan["live"]
    heads, kv_heads, head_dim = next(iter(plan["models"].values()))
    dtype = getattr(torch, plan["dtypes"][0])
    empty_cache = {"slots": slots, "live": live, "q": 8,
                   "over_full_cache": attention_case(heads, kv_heads, head_dim, slots, 8, live, dtype, device),
                   "over_live_cache": attention_case(heads, kv_heads, head_dim, live, 8, live, dtype, device)}
    return {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter: timings "
                                                                             "mean nothing)",
            "versions": _versions(), "attention": rows, "empty_cache": empty_cache,
            "greedy_accept": greedy_accept_case(plan["nodes"], plan["vocab"], device),
            "seconds": round(time.perf_counter() - start, 1)}


def attention_case(heads: int, kv_heads: int, head_dim: int, slots: int, q: int, live: int, dtype, device) -> dict:
    """Times and errors of one verification call: q new rows after `live - q` cached keys,
    in a cache of `slots` slots (keys past `live` masked out)."""
    import torch
    import torch.nn.functional as F

    from specc.kernels import ops, reference

    generator = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(1, heads, q, head_dim, generator=generator, device=device, dtype=dtype)
    key = torch.randn(1, kv_heads, slots, head_dim, generator=generator, device=device, dtype=dtype)
    value = torch.randn(1, kv_heads, slots, head_dim, generator=generator, device=device, dtype=dtype)
    mask = verification_mask(q, live, slots, device)
    kernel = lambda: ops.tree_attention(query, key, value, mask)   # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)   # noqa: E731
    exact = reference.tree_attention(query.double(), key.double(), value.double(), mask)
    result = {"kernel_ms": _time(kernel, device), "sdpa_ms": _time(sdpa, device),
              "sdpa_math_ms": _time_with_backend(sdpa, device, "MATH"),
              "kernel_error": float((kernel().double() - exact).abs().max()),
              "sdpa_error": float((sdpa().double() - exact).abs().max()),
              "kernel_row_invariant": _row_invariant(ops.tree_attention, query, key, value, mask),
              "sdpa_row_invariant": _row_invariant(
                  lambda *a: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3], enable_gqa=True),
                  query, key, value, mask)}
    result["kernel_over_sdpa"] = round(result["kernel_ms"] / result["sdpa_ms"], 3) if result["sdpa_ms"] else None
    return result


def verification_mask(q: int, live: int, slots: int, device):
    """[1, 1, q, slots]: the `live - q` prefix keys, a causal block over the q new rows, nothing past `live`."""
    import torch

    rows = torch.arange(q, device=device)[:, None] + (live - q)
    cols = torch.arange(slots, device=device)[None, :]
    return (cols <= rows)[None, None]


def _row_invariant(attend, query, key, value, mask) -> bool:
    """Row 0 of the q-row call, bitwise, against the same row called alone."""
    alone = attend(query[:, :, :1], key, value, mask[:, :, :1])
    return bool((attend(query, key, value, mask)[:, :, :1] == alone).all())


def greedy_accept_case(nodes: int, vocab: int, device) -> dict:
    import torch

    from specc.kernels import ops, reference

    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(nodes, vocab, generator=generator, device=device)
    parents = torch.tensor([-1] + [max(0, (i - 1) // 2) for i in range(1, nodes)], device=device)
    node_tokens = logits.argmax(-1).roll(1)
    node_tokens[0] = 0
    kernel = lambda: ops.greedy_accept(logits, node_tokens, parents)   # noqa: E731
    host = lambda: reference.greedy_accept(logits.cpu(), node_tokens.cpu(), parents.cpu())   # noqa: E731
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(kernel(), host()))
    return {"nodes": nodes, "vocab": vocab, "kernel_ms": _time(kernel, device),
            "host_reference_ms": _time(host, device), "identical": same}


def _time(fn, device) -> float:
    if device == "cuda":
        from triton.testing import do_bench

        return round(float(do_bench(fn, warmup=10, rep=40, return_mode="median")), 4)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 4)


def _time_with_backend(fn, device, backend: str) -> float | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return _time(fn, device)
    except RuntimeError:   # the backend does not take this shape or mask
        return None


def _versions() -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version}


def markdown(report: dict) -> str:
    lines = [f"# specc kernels against SDPA: {report['device']}", "",
             f"torch {report['versions']['torch']}, triton {report['versions']['triton']}; median ms "
             f"(`triton.testing.do_bench`); errors: max abs against a float64 reference; row invariant: row 0 "
             f"of the q-row call bitwise equal to a 1-row call", "",
             "| model | dtype | kv | q | kernel ms | SDPA ms | SDPA math ms | kernel / SDPA | kernel error | "
             "SDPA error | kernel row-invariant | SDPA row-invariant |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["attention"]:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['kv']} | {r['q']} | {r['kernel_ms']} | {r['sdpa_ms']} | "
                     f"{r['sdpa_math_ms']} | {r['kernel_over_sdpa']} | {r['kernel_error']:.2e} | "
                     f"{r['sdpa_error']:.2e} | {r['kernel_row_invariant']} | {r['sdpa_row_invariant']} |")
    cache = report["empty_cache"]
    full, live = cache["over_full_cache"], cache["over_live_cache"]
    lines += ["", f"Empty cache: {cache['q']} rows over a {cache['slots']}-slot cache holding {cache['live']} "
                  f"tokens: kernel {full['kernel_ms']} ms, SDPA {full['sdpa_ms']} ms; over a {cache['live']}-slot "
                  f"cache: kernel {live['kernel_ms']} ms, SDPA {live['sdpa_ms']} ms.",
              "", (lambda g: f"greedy_accept ({g['nodes']} nodes x {g['vocab']}): kernel {g['kernel_ms']} ms, host "
                             f"reference {g['host_reference_ms']} ms, identical: {g['identical']}.")(
                  report["greedy_accept"]),
              "", f"({report['seconds']} s in all)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
