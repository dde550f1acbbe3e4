"""Quality of a lossy early-exit engine (SpecEE `mode=ar` or `mode=tree`) against the dense model.

On the same prompts as `specc bench`, for each prompt:

- teacher-forced agreement: the dense model's greedy continuation is fed
  through the engine's own early-exit steps (its KV policy and online
  schedule included); the share of positions where the engine's token
  equals the dense one. `ar`: one step per token. `tree`: each round
  drafts and verifies a tree on the dense context; its tokens are judged
  up to the first one that differs, which is replaced by the dense token
  (only the agreeing accepted rows are committed), so every position is
  judged once, as in `ar`;
- tokens before the first divergence of the engine's free-running greedy
  output from Hugging Face greedy;
- mean layers executed per early-exit step (`tree`: per tree forward;
  `mean_accepted_path_layers` is the accepted path's exit) and the free
  run's mean accepted length (tokens per target forward).

    python benchmarks/early_exit_quality.py ENGINE [--prompts spec_bench] [--num-prompts 8]
        [--max-new-tokens 48] [--set kv_policy=mask] [--output FILE.json]

`--set KEY=VALUE` overrides a run-time field of the engine's method config
(e.g. the KV policy or the threshold) without recompiling.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--prompts", default="spec_bench")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    report = measure(args.engine, args.prompts, args.num_prompts, args.max_new_tokens, args.settings)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


def measure(engine_dir: Path, prompts: str, num_prompts: int, max_new_tokens: int,
            settings: list[str] = ()) -> dict:
    from specc.bench.baselines import source_checkpoint
    from specc.bench.harness import encode_fitting
    from specc.data.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.testing.checkpoints import hf_greedy

    engine = load_engine(engine_dir)
    if settings:
        stored = [f"{key}={value}" for key, value in engine.config.to_json().items() if value is not None]
        engine.config = engine.method.config_class.from_assignments(stored + list(settings))
        engine.runtime = engine.method.build_runtime(engine.context, engine.config)
    target, drafter = engine.runtime.target, engine.runtime.drafter
    mode = engine.config.mode if engine.method.name == "specee" else None
    if mode not in ("ar", "tree"):
        raise SystemExit(f"{engine_dir} is not a lossy early-exit engine (specee mode=ar or mode=tree)")
    _, prompt_ids, _ = encode_fitting(engine, load_prompt_set(prompts, num_prompts), max_new_tokens)
    dense = hf_greedy(source_checkpoint(engine.manifest), prompt_ids, max_new_tokens)
    rows = []
    for ids, reference in zip(prompt_ids, dense):
        agreement, layers = (teacher_forced(target, ids, reference) if mode == "ar"
                             else teacher_forced_tree(target, drafter, ids, reference))
        free = engine.generate_ids(ids, max_new_tokens)
        rows.append({"positions": len(reference) - 1, "agreement": agreement,
                     "tokens_before_divergence": first_divergence(free.token_ids, reference),
                     "mean_layers_executed": layers,
                     "mean_accepted_length": round(free.stats.mean_accepted_length, 3)})
        if mode == "tree":
            rows[-1]["mean_accepted_path_layers"] = target.method_report()["mean_accepted_path_layers"]
    total = sum(r["positions"] for r in rows)
    return {
        "engine": str(engine_dir), "method_config": engine.config.to_json(),
        "prompts": prompts, "num_prompts": len(rows), "max_new_tokens": max_new_tokens,
        "num_layers": target.early.layerwise.num_layers,
        "teacher_forced_agreement": round(sum(r["agreement"] * r["positions"] for r in rows) / total, 4),
        "mean_tokens_before_divergence": round(sum(r["tokens_before_divergence"] for r in rows) / len(rows), 2),
        "identical_prompts": sum(r["tokens_before_divergence"] == len(d) for r, d in zip(rows, dense)),
        "mean_layers_executed": round(sum(r["mean_layers_executed"] * r["positions"] for r in rows) / total, 3),
        "mean_accepted_length": round(sum(r["mean_accepted_length"] for r in rows) / len(rows), 3),
        "per_prompt": rows,
    }


def teacher_forced(target, prompt: list[int], reference: list[int]) -> tuple[float, float]:
    """Feed the dense continuation through the engine's early-exit steps; (agreement, mean layers)."""
    with torch.inference_mode():
        target.prefill(torch.tensor(prompt), 0)
        target.early.take_report()
        agree = 0
        for i, token in enumerate(reference[:-1]):
            logits = target.prefill(torch.tensor([token]), len(prompt) + i).logits
            agree += int(logits[-1].argmax()) == reference[i + 1]
        report = target.early.take_report()
    positions = max(1, len(reference) - 1)
    return agree / positions, report["mean_layers_executed"] or float(report["num_layers"])


def teacher_forced_tree(target, drafter, prompt: list[int], reference: list[int]) -> tuple[float, float]:
    """Tree rounds on the dense context; (agreement, mean layers per tree forward)."""
    from specc.contract.verification import Acceptance
    from specc.contract.drafter import DraftBudget
    from specc.contract.sampling import SamplingConfig

    with torch.inference_mode():
        prefill = target.prefill(torch.tensor(prompt), 0)
        drafter.begin(torch.tensor(prompt), prefill)
        target.method_report()
        tokens, agree, i = list(prompt) + reference[:1], 0, 1
        while i < len(reference):
            prefix_len = len(tokens) - 1
            budget = DraftBudget(max_depth=len(reference) - i - 1, max_nodes=target.max_seq_len - prefix_len)
            draft = drafter.propose(tokens, budget, SamplingConfig(), None) if budget.max_depth > 0 else None
            if draft is None:
                verification = target.prefill(torch.tensor(tokens[-1:]), prefix_len)
                agree += int(verification.logits[-1].argmax()) == reference[i]
                drafter.observe(None, None, verification)
                tokens.append(reference[i])
                i += 1
                continue
            verification = target.verify_tree(draft, prefix_len)
            path = verification.acceptance.path
            emitted = draft.node_tokens[path[1:]].tolist() + [verification.acceptance.next_token]
            matched = 0
            while matched < len(emitted) and emitted[matched] == reference[i + matched]:
                matched += 1
            kept = min(matched, len(path) - 1)    # accepted rows that agree; the next is the dense token
            agree += kept + int(matched == len(emitted))
            target.commit(prefix_len, path[:kept + 1])
            drafter.observe(draft, Acceptance(path[:kept + 1], reference[i + kept]), verification)
            tokens += reference[i:i + kept + 1]
            i += kept + 1
        report = target.method_report()
    positions = max(1, len(reference) - 1)
    return agree / positions, report["mean_layers_executed"] or float(report["num_layers"])


def first_divergence(output: list[int], reference: list[int]) -> int:
    for i, (a, b) in enumerate(zip(output, reference)):
        if a != b:
            return i
    return min(len(output), len(reference))


if __name__ == "__main__":
    sys.exit(main())
