"""One CPU engine loaded twice, its weights and key/value caches on 4 KiB pages in one and on 2 MiB
huge pages in the other (`specc.host.huge_pages`), decoding the same prompts in turn in one process.

    OMP_NUM_THREADS=2 python benchmarks/pages_side_by_side.py build/smol/none-q4 --rounds 8
    python benchmarks/pages_side_by_side.py build/smol/none-bf16-aoti --rounds 8 --weights-only

The 4 KiB copies (of the packed weights, and the caches) are made by torch's own allocator, which
asks for no huge pages: what a kernel whose page cache maps a weight file in 4 KiB pages gives an
engine that reads the file in place. A float engine's weights stay mapped from its file (eager,
inductor) or where its AOTI package put them, instead of being read or collapsed onto huge pages. Prints each copy's load time,
its median time over the rounds, their ratio, and whether their tokens agree.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import specc.engine.loaded as loaded
import specc.lower.aoti as aoti
import specc.runtime.kv_cache as kv_cache
from specc.engine.weight_pages import weights_on_huge_pages
from specc.host.collapsed_pages import new_memory_on_huge_pages
from specc.host.huge_pages import huge_page_bytes, on_huge_pages

PROMPTS = ("def quicksort(xs):\n    \"\"\"Sort a list of numbers.\"\"\"\n",
           "Explain in two paragraphs why the sky is blue.")


def weights_on_small_pages(path, tensors: dict, floats=()) -> dict:
    """Packed weights copied by torch's allocator; float weights mapped from the file as loaded."""
    return tensors | {name: t.clone() for name, t in tensors.items() if not t.is_floating_point() and t.device.type == "cpu"}


def caches_on_small_pages(tensors: dict) -> dict:
    return dict(tensors)   # torch.zeros made them


def load_on(path: str, small: bool, caches_on_huge_pages: bool = False):
    """The engine at `path`, its packed weights, its AOTI packages' own weights and its caches on
    4 KiB pages if `small` (the caches on huge pages all the same if `caches_on_huge_pages`), else
    on huge pages."""
    loaded.weights_on_huge_pages = weights_on_small_pages if small else weights_on_huge_pages
    kv_cache.on_huge_pages = caches_on_small_pages if small and not caches_on_huge_pages else on_huge_pages
    aoti.new_memory_on_huge_pages = contextlib.nullcontext if small else new_memory_on_huge_pages
    try:
        start = time.perf_counter()
        engine = loaded.load_engine(path, device="cpu")
        print(f"loaded on {'4 KiB' if small else '2 MiB'} pages in {time.perf_counter() - start:.2f} s")
        return engine
    finally:
        loaded.weights_on_huge_pages, kv_cache.on_huge_pages = weights_on_huge_pages, on_huge_pages
        aoti.new_memory_on_huge_pages = new_memory_on_huge_pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--weights-only", action="store_true",
                        help="the caches on huge pages in both copies: what the weights' pages alone change")
    args = parser.parse_args()
    if not huge_page_bytes():
        raise SystemExit("pages_side_by_side: this kernel lends no huge pages (or SPECC_HUGE_PAGES=0)")
    engines = {"4 KiB pages": load_on(args.engine, small=True, caches_on_huge_pages=args.weights_only),
               "2 MiB pages": load_on(args.engine, small=False)}
    prompts = [engines["2 MiB pages"].encode(prompt) for prompt in PROMPTS]
    seconds = {name: [] for name in engines}
    tokens = {}
    for round_ in range(args.rounds + 1):   # round 0 warms both up
        for name in (list(engines) if round_ % 2 else list(engines)[::-1]):
            start = time.perf_counter()
            tokens[name] = [engines[name].generate_ids(ids, args.max_new_tokens).token_ids for ids in prompts]
            if round_:
                seconds[name].append(time.perf_counter() - start)
    for name, times in seconds.items():
        print(f"{name}: median {statistics.median(times):.3f} s over {len(times)} rounds "
              f"({', '.join(f'{t:.3f}' for t in times)})")
    ratio = statistics.median(seconds["2 MiB pages"]) / statistics.median(seconds["4 KiB pages"])
    print(f"time on 2 MiB pages / time on 4 KiB pages: {ratio:.3f}; tokens "
          f"{'identical' if tokens['4 KiB pages'] == tokens['2 MiB pages'] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
