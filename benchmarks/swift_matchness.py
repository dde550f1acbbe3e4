"""Matchness of SWIFT's initial (odd-layer) skip set against the set an
engine stores, on prompts the compile-time calibration did not see.

    python benchmarks/swift_matchness.py ENGINE_DIR [--skip-first 8] [--num-prompts 8]

Each prompt is decoded greedily (64 tokens, no adaptation) and both sets are
scored with the drafter's own matchness (teacher-forced top-1 agreement on
the first `context_window` generated tokens). The calibration reads the
first `calib_prompts` prompts of the same built-in set, hence --skip-first.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine")
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--skip-first", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from specc.bench.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.methods.swift_search import describe_skip_set, odd_layers

    engine = load_engine(args.engine)
    drafter = engine.drafter
    drafter.config = dataclasses.replace(drafter.config, adapt=False)   # score fixed sets only
    stored = drafter.skip_set
    initial = odd_layers(drafter.skippable)
    prompts = load_prompt_set(args.prompts, args.skip_first + args.num_prompts).prompts[args.skip_first:]
    scores = {"initial": [], "stored": []}
    for prompt in prompts:
        ids = engine.encode(prompt.text)
        tokens = ids + engine.generate_ids(ids, args.max_new_tokens).token_ids
        if len(tokens) - len(ids) < drafter.config.context_window + 1:
            continue
        with torch.inference_mode():
            for name, skip in (("initial", initial), ("stored", stored)):
                scores[name].append(drafter.matchness(tokens, len(ids), skip))
    for name, skip in (("initial", initial), ("stored", stored)):
        print(f"{name:<8} {describe_skip_set(skip):<28} matchness mean {statistics.mean(scores[name]):.3f} "
              f"over {len(scores[name])} held-out prompts")


if __name__ == "__main__":
    main()
