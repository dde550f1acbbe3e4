"""specc's kernels against the library on verification shapes: time, error, row invariance.

    python benchmarks/kernels_bench.py [--out DIR] [--quick]      # on a CUDA GPU
    python benchmarks/kernels_bench.py --smoke --out DIR          # the script itself, on the CPU
    python benchmarks/kernels_bench.py --compile-only --out DIR   # compile for sm_90, no GPU needed

For every (model shape, dtype, kv, q): `torch.ops.specc.tree_attention` (given the live
length `kv_len`, as `use_kernels` passes it) against `F.scaled_dot_product_attention`
with the same boolean mask (default dispatch, and the math backend), as the median of
`triton.testing.do_bench`; the kernel's and SDPA's max abs error against a float64
reference; and whether row 0 of a q-row call is bitwise the row of a 1-row call (row
invariance: what lets a bfloat16 verification match a decode step). The mask is a
verification's: every live prefix key, then a causal block over the q new rows.

Also, per model:
- the live-length path: q rows over a 2,048-slot cache holding 300 tokens (`kv_len`
  300) against a 300-slot cache, kernel and SDPA, and whether the kernel's two
  outputs are bitwise equal (they should be: split and tile boundaries are fixed
  multiples over the key axis);
- bitwise row invariance for q = 1..64 in bfloat16: every row of every q-row call
  (`kv_len` = prefix + q) against the same row called alone (the decode step after
  its ancestors, `kv_len` = prefix + row + 1), kernel and SDPA;
- `greedy_accept` and `sample_accept` (16 nodes x 49,152 vocabulary) against their host
  references.

Writes `kernels-bench.json` and `kernels-bench.md` under `--out` (default `$OUT`, else
the current directory). `--smoke` runs a few tiny shapes on the CPU through Triton's
interpreter, to test the script; its timings mean nothing. `--compile-only` compiles every
variant the GPU run would launch (each autotune config, fused or not, both model shapes,
bf16/fp16/fp32) for `--arch` (default 90, the H100) with Triton's bundled ptxas, on a machine
without a GPU: it catches what the interpreter cannot (layouts, shared memory, types), and
writes `kernels-compile.json` (seconds and shared memory per variant). `TRITON_INTERPRET`
must be unset for it.
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
    parser.add_argument("--quick", action="store_true", help="bfloat16, kv 512, 1024, 4096 and q 1, 8, 16, 64 only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton's interpreter)")
    parser.add_argument("--compile-only", action="store_true", help="compile the GPU variants; no GPU needed")
    parser.add_argument("--arch", type=int, default=90, help="with --compile-only: the CUDA compute capability")
    parser.add_argument("--first-config", action="store_true",
                        help="with --compile-only: the first autotune config, bfloat16 and SmolLM2's shape only")
    args = parser.parse_args(argv)
    if args.compile_only:
        if os.environ.get("TRITON_INTERPRET") == "1":
            print("kernels_bench: --compile-only needs TRITON_INTERPRET unset", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        compiled = compile_for_gpu(args.arch, args.first_config)
        (args.out / "kernels-compile.json").write_text(json.dumps(compiled, indent=1) + "\n")
        print(json.dumps(compiled, indent=1))
        return 0
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton
    import torch

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("kernels_bench: needs a CUDA GPU (or --smoke on the CPU)", file=sys.stderr)
        return 2
    plan = _plan(args)
    args.out.mkdir(parents=True, exist_ok=True)

    def save(report: dict) -> None:
        """After every section: a run stopped by a time limit keeps what it measured."""
        (args.out / "kernels-bench.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "kernels-bench.md").write_text(markdown(report))

    report = run(plan, device, save)
    print(markdown(report))
    return 0


def _plan(args) -> dict:
    if args.smoke:
        return {"models": {"tiny": (4, 2, 16)}, "kv": (24,), "rows": (1, 3), "dtypes": ("float32",),
                "live": (96, 20, 4), "sweep": (21, 4, "bfloat16"), "vocab": 64, "nodes": 4,
                "splits": (96, (1,), (16, 32))}
    kv, rows, dtypes = ((512, 1024, 4096), (1, 8, 16, 64), ("bfloat16",)) if args.quick else (KV, ROWS, DTYPES)
    # live: (slots, live tokens, q); sweep: (prefix, largest q, dtype)
    return {"models": MODELS, "kv": kv, "rows": rows, "dtypes": dtypes, "live": (2048, 300, 16),
            "sweep": (1000, 64, "bfloat16"), "vocab": 49152, "nodes": 16,
            "splits": (4096, (1, 16), (128, 256, 512))}   # splits: (slots, q rows, keys per split)


def run(plan: dict, device: str, save=lambda report: None) -> dict:
    """The sections in order of interest (the live-length path and row invariance first), each
    added to the report and saved as soon as it is measured."""
    import torch

    start = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter: timings "
                                                                               "mean nothing)",
              "versions": _versions(), "empty_cache": [], "row_invariance": [], "attention": [],
              "greedy_accept": None, "sample_accept": None, "split_sweep": [], "seconds": None}

    def section(name: str, value) -> None:
        if isinstance(report[name], list):
            report[name].append(value)
        else:
            report[name] = value
        report["seconds"] = round(time.perf_counter() - start, 1)
        save(report)

    dtype_name = plan["dtypes"][0]
    for model, shape in plan["models"].items():
        section("empty_cache", {"model": model, "dtype": dtype_name,
                                **live_length_case(*shape, *plan["live"], getattr(torch, dtype_name), device)})
    prefix, most_rows, sweep_dtype = plan["sweep"]
    for model, shape in plan["models"].items():
        section("row_invariance", {"model": model, "dtype": sweep_dtype, **row_invariance_sweep(
            *shape, prefix, most_rows, getattr(torch, sweep_dtype), device)})
    for model, (heads, kv_heads, head_dim) in plan["models"].items():
        for dtype_name in plan["dtypes"]:
            dtype = getattr(torch, dtype_name)
            for kv in plan["kv"]:
                for q in plan["rows"]:
                    section("attention", {"model": model, "dtype": dtype_name, "kv": kv, "q": q,
                                          **attention_case(heads, kv_heads, head_dim, kv, q, kv, dtype, device)})
    section("greedy_accept", greedy_accept_case(plan["nodes"], plan["vocab"], device))
    section("sample_accept", sample_accept_case(plan["nodes"], plan["vocab"], device))
    slots, split_rows, splits = plan["splits"]
    for model, shape in plan["models"].items():
        for q in split_rows:
            section("split_sweep", {"model": model, "dtype": sweep_dtype,
                                    **split_case(*shape, slots, q, splits, getattr(torch, sweep_dtype), device)})
    report["tree_attention_configs"] = _chosen_configs()
    save(report)
    return report


def _chosen_configs() -> dict:
    from specc.kernels.dispatch import triton_kernel_module

    return triton_kernel_module("tree_attention").chosen_configs()


def attention_inputs(heads: int, kv_heads: int, head_dim: int, q: int, slots: int, dtype, device, seed: int = 0):
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    query = torch.randn(1, heads, q, head_dim, generator=generator, device=device, dtype=dtype)
    key = torch.randn(1, kv_heads, slots, head_dim, generator=generator, device=device, dtype=dtype)
    value = torch.randn(1, kv_heads, slots, head_dim, generator=generator, device=device, dtype=dtype)
    return query, key, value


def attention_case(heads: int, kv_heads: int, head_dim: int, slots: int, q: int, live: int, dtype, device) -> dict:
    """Times and errors of one verification call: q new rows after `live - q` cached keys,
    in a cache of `slots` slots (keys past `live` masked out; the kernel is told `kv_len`)."""
    import torch
    import torch.nn.functional as F

    from specc.kernels import ops, reference

    query, key, value = attention_inputs(heads, kv_heads, head_dim, q, slots, dtype, device)
    mask = verification_mask(q, live, slots, device)
    kv_len = torch.tensor(live, device=device)
    kernel = lambda: ops.tree_attention(query, key, value, mask, kv_len=kv_len)   # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)   # noqa: E731
    exact = reference.tree_attention(query.double(), key.double(), value.double(), mask)
    result = {"kernel_ms": _time(kernel, device), "sdpa_ms": _time(sdpa, device),
              "kernel_graph_ms": _time_graphed(kernel, device), "sdpa_graph_ms": _time_graphed(sdpa, device),
              "sdpa_math_ms": _time_with_backend(sdpa, device, "MATH"),
              "kernel_error": float((kernel().double() - exact).abs().max()),
              "sdpa_error": float((sdpa().double() - exact).abs().max()),
              "kernel_row_invariant": _row_invariant(
                  lambda *a, live: ops.tree_attention(*a, kv_len=torch.tensor(live, device=device)),
                  query, key, value, mask, live),
              "sdpa_row_invariant": _row_invariant(
                  lambda *a, live: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3], enable_gqa=True),
                  query, key, value, mask, live)}
    result["kernel_over_sdpa"] = _ratio(result["kernel_ms"], result["sdpa_ms"])
    result["kernel_over_sdpa_graph"] = _ratio(result["kernel_graph_ms"], result["sdpa_graph_ms"])
    return result


def live_length_case(heads: int, kv_heads: int, head_dim: int, slots: int, live: int, q: int, dtype,
                     device) -> dict:
    """q rows over `slots` slots holding `live` tokens (kv_len = live) against the same keys in a
    `live`-slot cache: what the dead part of a cache costs, and whether the outputs are bitwise equal."""
    import torch
    import torch.nn.functional as F

    from specc.kernels import ops

    query, key, value = attention_inputs(heads, kv_heads, head_dim, q, slots, dtype, device, seed=1)
    full_mask, live_mask = verification_mask(q, live, slots, device), verification_mask(q, live, live, device)
    live_key, live_value = key[:, :, :live].contiguous(), value[:, :, :live].contiguous()
    kv_len = torch.tensor(live, device=device)
    over_full = lambda: ops.tree_attention(query, key, value, full_mask, kv_len=kv_len)   # noqa: E731
    over_live = lambda: ops.tree_attention(query, live_key, live_value, live_mask, kv_len=kv_len)   # noqa: E731
    sdpa = lambda k, v, m: (   # noqa: E731
        lambda: F.scaled_dot_product_attention(query, k, v, attn_mask=m, enable_gqa=True))
    result = {"slots": slots, "live": live, "q": q,
              "kernel_full_ms": _time(over_full, device), "kernel_live_ms": _time(over_live, device),
              "sdpa_full_ms": _time(sdpa(key, value, full_mask), device),
              "sdpa_live_ms": _time(sdpa(live_key, live_value, live_mask), device),
              "kernel_full_graph_ms": _time_graphed(over_full, device),
              "kernel_live_graph_ms": _time_graphed(over_live, device),
              "kernel_bitwise_equal": bool(torch.equal(over_full(), over_live()))}
    result["kernel_full_over_live"] = _ratio(result["kernel_full_ms"], result["kernel_live_ms"])
    result["kernel_full_over_live_graph"] = _ratio(result["kernel_full_graph_ms"], result["kernel_live_graph_ms"])
    return result


def split_case(heads: int, kv_heads: int, head_dim: int, slots: int, q: int, splits: tuple[int, ...], dtype,
               device) -> dict:
    """The kernel, replayed from a CUDA graph, at each split size (keys per split-KV program):
    fewer keys per program means more programs for the few rows of a decode step, and one more
    partial result per row to combine. Data for choosing `SPLIT_KV`, which fixes the arithmetic."""
    import torch

    from specc.kernels import reference
    from specc.kernels.dispatch import triton_kernel_module

    attention = triton_kernel_module("tree_attention").tree_attention
    query, key, value = attention_inputs(heads, kv_heads, head_dim, q, slots, dtype, device, seed=3)
    mask = verification_mask(q, slots, slots, device)
    kv_len = torch.tensor(slots, device=device)
    exact = reference.tree_attention(query.double(), key.double(), value.double(), mask)
    calls = {split: (lambda split=split: attention(query, key, value, mask, kv_len=kv_len, split_kv=split))
             for split in splits}
    return {"slots": slots, "q": q,
            "graph_ms_by_split": {str(split): _time_graphed(call, device) for split, call in calls.items()},
            "error_by_split": {str(split): float((call().double() - exact).abs().max())
                               for split, call in calls.items()}}


def row_invariance_sweep(heads: int, kv_heads: int, head_dim: int, prefix: int, most_rows: int, dtype,
                         device) -> dict:
    """Every row of every q-row call (q = 1..most_rows, a chain after `prefix` keys, kv_len = prefix + q)
    against the same row alone (kv_len = prefix + row + 1, its own mask row), bitwise."""
    import torch
    import torch.nn.functional as F

    from specc.kernels import ops

    slots = prefix + most_rows
    query, key, value = attention_inputs(heads, kv_heads, head_dim, most_rows, slots, dtype, device, seed=2)
    mask = verification_mask(most_rows, slots, slots, device)
    lengths = torch.arange(prefix + 1, slots + 1, device=device)   # kv_len of each row's own step
    attend = {"kernel": lambda q, m, n: ops.tree_attention(q, key, value, m, kv_len=lengths[n - 1]),
              "sdpa": lambda q, m, n: F.scaled_dot_product_attention(q, key, value, attn_mask=m, enable_gqa=True)}
    result = {"prefix": prefix, "rows": most_rows}
    for name, fn in attend.items():
        alone = torch.cat([fn(query[:, :, i:i + 1], mask[:, :, i:i + 1], i + 1) for i in range(most_rows)], dim=2)
        failures = [q for q in range(1, most_rows + 1)
                    if not torch.equal(fn(query[:, :, :q], mask[:, :, :q], q), alone[:, :, :q])]
        result[f"{name}_invariant_calls"] = most_rows - len(failures)
        result[f"{name}_first_failure_q"] = failures[0] if failures else None
    return result


def verification_mask(q: int, live: int, slots: int, device):
    """[1, 1, q, slots]: the `live - q` prefix keys, a causal block over the q new rows, nothing past `live`."""
    import torch

    rows = torch.arange(q, device=device)[:, None] + (live - q)
    cols = torch.arange(slots, device=device)[None, :]
    return (cols <= rows)[None, None]


def _row_invariant(attend, query, key, value, mask, live: int) -> bool:
    """Row 0 of the q-row call, bitwise, against the same row called alone (its own live length)."""
    import torch

    alone = attend(query[:, :, :1], key, value, mask[:, :, :1], live=live - query.shape[2] + 1)
    return torch.equal(attend(query, key, value, mask, live=live)[:, :, :1], alone)


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


def sample_accept_case(nodes: int, vocab: int, device) -> dict:
    """A binary tree of `nodes` candidates (point masses), the kernel against its host reference
    with the same uniforms."""
    import torch

    from specc.kernels import ops, reference

    generator = torch.Generator(device=device).manual_seed(0)
    probs = torch.softmax(torch.randn(nodes, vocab, generator=generator, device=device) * 3, dim=-1)
    parents = torch.tensor([-1] + [max(0, (i - 1) // 2) for i in range(1, nodes)], device=device)
    node_tokens = probs.argmax(-1).roll(1)
    uniforms = torch.rand(nodes + 1, generator=generator, device=device)
    kernel = lambda: ops.sample_accept(probs, node_tokens, parents, uniforms)   # noqa: E731
    host = lambda: reference.sample_accept(probs.cpu(), node_tokens.cpu(), parents.cpu(), uniforms.cpu())   # noqa: E731
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


def _time_graphed(fn, device) -> float | None:
    """Median ms of `fn` replayed from a CUDA graph, as an engine on CUDA calls it: no host
    launch cost, which for calls this small can exceed the GPU's work. None on the CPU, or
    when `fn` cannot be captured."""
    if device != "cuda":
        return None
    from triton.testing import do_bench_cudagraph

    try:
        return round(float(do_bench_cudagraph(fn, rep=40, return_mode="median")), 4)
    except RuntimeError:
        return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator and denominator else None


def _time_with_backend(fn, device, backend: str) -> float | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return _time(fn, device)
    except RuntimeError:   # the backend does not take this shape or mask
        return None


def compile_for_gpu(arch: int, first_config: bool = False) -> list[dict]:
    """Compile each kernel variant for `cuda:arch` (no GPU, no launch)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    from specc.kernels.dispatch import triton_kernel_module

    attention, greedy, sampling = (triton_kernel_module(name) for name in
                                   ("tree_attention", "greedy_accept", "sample_accept"))
    target = GPUTarget("cuda", arch, 32)
    compiled = []

    def build(fn, types: dict, constants: dict, num_warps: int = 4, num_stages: int = 3) -> None:
        signature = {name: types.get(name, "i32") for name in fn.arg_names if name not in constants}
        signature.update(dict.fromkeys(constants, "constexpr"))
        source = ASTSource(fn=fn, signature=signature,
                           constexprs={(fn.arg_names.index(name),): value for name, value in constants.items()})
        start = time.perf_counter()
        kernel = triton_compile(source, target=target, options={"num_warps": num_warps, "num_stages": num_stages})
        compiled.append({"kernel": fn.__name__, **{k: v for k, v in constants.items()}, "num_warps": num_warps,
                         "num_stages": num_stages, "shared_bytes": kernel.metadata.shared,
                         "seconds": round(time.perf_counter() - start, 2)})

    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    models = dict(list(MODELS.items())[:1]) if first_config else MODELS
    configs = attention.CONFIGS[:1] if first_config else attention.CONFIGS
    for dtype in ("bfloat16",) if first_config else ("bfloat16", "float16", "float32"):
        element = "*" + short[dtype]
        types = {"query": element, "key": element, "value": element, "mask": "*i1", "kv_len_ptr": "*i64",
                 "out": element, "part_acc": "*fp32", "part_m": "*fp32", "part_l": "*fp32", "qk_scale": "fp32"}
        for heads, kv_heads, head_dim in models.values():
            block_d = max(16, 1 << (head_dim - 1).bit_length())
            for config in configs[:1] if dtype == "float32" else configs:   # fp32 only to check it builds
                for fused in (False, True):
                    build(attention._split_kernel, types, dict(
                        GROUP=heads // kv_heads, HAS_KV_LEN=True, MASK_IS_BOOL=True, DOT_FP32=dtype == "float32",
                        FUSED=fused, BLOCK_M=attention.BLOCK_M, BLOCK_D=block_d, SPLIT_KV=attention.SPLIT_KV,
                        **config.kwargs), config.num_warps, config.num_stages)
            build(attention._combine_kernel, types, dict(GROUP=heads // kv_heads, HAS_KV_LEN=True,
                                                         BLOCK_R=attention.BLOCK_ROWS_COMBINE, BLOCK_D=block_d,
                                                         SPLIT_KV=attention.SPLIT_KV))
    build(greedy._row_argmax_kernel, {"logits": "*bf16", "best": "*i64"}, dict(BLOCK_VOCAB=greedy.BLOCK_VOCAB))
    build(greedy._walk_tree_kernel, {"best": "*i64", "node_tokens": "*i64", "parents": "*i64", "path": "*i64",
                                     "bonus": "*i64"}, {})
    for chain in (True, False):
        build(sampling._sample_accept_kernel, {
            "probs": "*fp32", "drafts": "*fp32", "node_tokens": "*i64", "parents": "*i64", "uniforms": "*fp32",
            "path": "*i64", "token_out": "*i64"}, dict(
            CHAIN=chain, BLOCK_NODES=64, BLOCK_VOCAB=sampling.BLOCK_VOCAB if chain else sampling.TREE_BLOCK_VOCAB))
    return compiled


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
             f"torch {report['versions']['torch']}, triton {report['versions']['triton']}; median ms: "
             f"launched (`triton.testing.do_bench`, host launch cost included) and graph (replayed from a "
             f"CUDA graph, `do_bench_cudagraph`: how an engine on CUDA calls it); errors: max abs against a "
             f"float64 reference; row invariant: row 0 of the q-row call bitwise equal to a 1-row call", ""]
    lines += _table(("model", "dtype", "kv", "q", "kernel ms", "SDPA ms", "kernel / SDPA", "kernel graph ms",
                     "SDPA graph ms", "kernel / SDPA, graph", "SDPA math ms", "kernel error", "SDPA error",
                     "kernel row-invariant", "SDPA row-invariant"),
                    [(r["model"], r["dtype"], r["kv"], r["q"], r["kernel_ms"], r["sdpa_ms"], r["kernel_over_sdpa"],
                      r.get("kernel_graph_ms"), r.get("sdpa_graph_ms"), r.get("kernel_over_sdpa_graph"),
                      r["sdpa_math_ms"], f"{r['kernel_error']:.2e}", f"{r['sdpa_error']:.2e}",
                      r["kernel_row_invariant"], r["sdpa_row_invariant"]) for r in report["attention"]])
    lines += ["", "Live length: q rows over a cache of `slots` slots holding `live` tokens (kernel given kv_len) "
                  "against a `live`-slot cache; bitwise: the kernel's two outputs equal", ""]
    lines += _table(("model", "dtype", "slots", "live", "q", "kernel ms (slots)", "kernel ms (live)", "ratio",
                     "graph ms (slots)", "graph ms (live)", "ratio, graph", "SDPA ms (slots)", "SDPA ms (live)",
                     "bitwise"),
                    [(c["model"], c["dtype"], c["slots"], c["live"], c["q"], c["kernel_full_ms"], c["kernel_live_ms"],
                      c["kernel_full_over_live"], c.get("kernel_full_graph_ms"), c.get("kernel_live_graph_ms"),
                      c.get("kernel_full_over_live_graph"), c["sdpa_full_ms"], c["sdpa_live_ms"],
                      c["kernel_bitwise_equal"]) for c in report["empty_cache"]])
    lines += ["", "Row invariance: calls with q = 1..rows (a chain after `prefix` keys) whose every row is bitwise "
                  "the same row called alone", ""]
    lines += _table(("model", "dtype", "prefix", "rows", "kernel calls invariant", "first kernel failure q",
                     "SDPA calls invariant", "first SDPA failure q"),
                    [(r["model"], r["dtype"], r["prefix"], r["rows"], f"{r['kernel_invariant_calls']}/{r['rows']}",
                      r["kernel_first_failure_q"], f"{r['sdpa_invariant_calls']}/{r['rows']}",
                      r["sdpa_first_failure_q"]) for r in report["row_invariance"]])
    for name in ("greedy_accept", "sample_accept"):
        g = report[name]
        if g is not None:
            lines += ["", f"{name} ({g['nodes']} nodes x {g['vocab']}): kernel {g['kernel_ms']} ms, host reference "
                          f"{g['host_reference_ms']} ms, identical: {g['identical']}."]
    if report.get("split_sweep"):
        splits = list(report["split_sweep"][0]["graph_ms_by_split"])
        lines += ["", "Split size: the kernel replayed from a CUDA graph with `split` keys per split-KV program "
                      "(ms; error against float64 in brackets)", ""]
        lines += _table(("model", "dtype", "slots", "q", *(f"split {n}" for n in splits)),
                        [(c["model"], c["dtype"], c["slots"], c["q"],
                          *(f"{c['graph_ms_by_split'][n]} [{c['error_by_split'][n]:.1e}]" for n in splits))
                         for c in report["split_sweep"]])
    if report.get("tree_attention_configs"):
        lines += ["", "tree_attention autotune choices: " + "; ".join(
            f"{key}: {config}" for key, config in report["tree_attention_configs"].items())]
    lines += ["", f"({report['seconds']} s in all{'' if report['sample_accept'] else ', stopped early'})"]
    return "\n".join(lines) + "\n"


def _table(headers: tuple[str, ...], rows: list[tuple]) -> list[str]:
    """A Markdown table: the header, its rule, one line per row."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


if __name__ == "__main__":
    raise SystemExit(main())
