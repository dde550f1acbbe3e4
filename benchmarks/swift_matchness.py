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


def measure(engine_dir: str, prompts: str = "code", skip_first: int = 8, num_prompts: int = 8,
            max_new_tokens: int = 64) -> dict:
    """{"initial"|"stored": {"skip": description, "scores": [per prompt]}}."""
    from specc.data.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.methods.swift.search import describe_skip_set, odd_layers

    engine = load_engine(engine_dir)
    if engine.manifest["method"] != "swift":
        raise SystemExit(f"{engine_dir} is a {engine.manifest['method']!r} engine, not swift")
    drafter = engine.drafter
    drafter.config = dataclasses.replace(drafter.config, adapt=False)   # score fixed sets only
    sets = {"initial": odd_layers(drafter.skippable), "stored": drafter.skip_set}
    result = {name: {"skip": describe_skip_set(skip), "scores": []} for name, skip in sets.items()}
    for prompt in load_prompt_set(prompts, skip_first + num_prompts).prompts[skip_first:]:
        ids = engine.encode(prompt.text)
        tokens = ids + engine.generate_ids(ids, max_new_tokens).token_ids
        if len(tokens) - len(ids) < drafter.config.context_window + 1:
            continue   # too short to score a full window (stopped at EOS)
        with torch.inference_mode():
            for name, skip in sets.items():
                result[name]["scores"].append(drafter.matchness(tokens, len(ids), skip))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine")
    parser.add_argument("--prompts", default="code")
    parser.add_argument("--skip-first", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    result = measure(args.engine, args.prompts, args.skip_first, args.num_prompts, args.max_new_tokens)
    for name, entry in result.items():
        if not entry["scores"]:
            raise SystemExit("no prompt generated enough tokens to score a window; raise --max-new-tokens")
        print(f"{name:<8} {entry['skip']:<28} matchness mean {statistics.mean(entry['scores']):.3f} "
              f"over {len(entry['scores'])} held-out prompts")


if __name__ == "__main__":
    main()
