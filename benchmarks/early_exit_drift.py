"""Where a lossy early-exit engine (SpecEE `mode=ar`) drifts from the dense model.

After a token exits at layer l, two things the dense model would have had
are approximated: the draft head's next input (the exit layer's state, not
the top layer's) and the K/V of layers above l (`kv_policy=propagate`:
projected from the exit state; `mask`: absent). This measures the
teacher-forced agreement (as `early_exit_quality.py`) four times on the
same prompts, repairing after every exit:

- `engine`: nothing (the engine as it runs);
- `dense_feature`: the draft head's next input becomes the dense top-layer
  feature of the exited token; its K/V stay as the engine wrote them;
- `dense_kv`: every layer's K/V of the exited token become the dense
  model's; the feature stays the exit state;
- `both`.

Each repair runs a full forward of the exited token (so this is a
diagnostic, not a decoding mode); the gap between the rows says which
approximation costs agreement.

    python benchmarks/early_exit_drift.py ENGINE [--prompts spec_bench] [--num-prompts 32]
        [--max-new-tokens 48] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"specc_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


teacher_forced = _sibling("early_exit_quality").teacher_forced

VARIANTS = {"engine": (False, False), "dense_feature": (True, False), "dense_kv": (False, True),
            "both": (True, True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--prompts", default="spec_bench")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    report = measure(args.engine, args.prompts, args.num_prompts, args.max_new_tokens)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


def measure(engine_dir: Path, prompts: str, num_prompts: int, max_new_tokens: int) -> dict:
    from specc.bench.baselines import source_checkpoint
    from specc.bench.harness import encode_fitting
    from specc.data.prompts import load_prompt_set
    from specc.engine.loaded import load_engine
    from specc.testing.checkpoints import hf_greedy

    engine = load_engine(engine_dir)
    if engine.method.name != "specee" or engine.config.mode != "ar":
        raise SystemExit(f"{engine_dir} is not a SpecEE mode=ar engine")
    target = engine.runtime.target
    _, prompt_ids, _ = encode_fitting(engine, load_prompt_set(prompts, num_prompts), max_new_tokens)
    dense = hf_greedy(source_checkpoint(engine.manifest), prompt_ids, max_new_tokens)
    positions = sum(len(reference) - 1 for reference in dense)
    step = target.prefill
    agreement = {}
    try:
        for name, (feature, kv) in VARIANTS.items():
            target.prefill = repairing(target, step, feature, kv)
            agreed = sum(teacher_forced(target, ids, reference)[0] * (len(reference) - 1)
                         for ids, reference in zip(prompt_ids, dense))
            agreement[name] = round(agreed / positions, 4)
    finally:
        target.prefill = step
    return {"engine": str(engine_dir), "method_config": engine.config.to_json(), "prompts": prompts,
            "num_prompts": len(prompt_ids), "max_new_tokens": max_new_tokens, "positions": positions,
            "teacher_forced_agreement": agreement}


def repairing(target, step, dense_feature: bool, dense_kv: bool):
    """`target.prefill`, followed after each early exit by the chosen repairs."""
    from specc.methods.specee.early_exit import FEATURE
    from specc.methods.specee.runtime import EXIT_LAYER

    last_layer = target.early.layerwise.num_layers - 1

    def prefill(tokens: torch.Tensor, start: int):
        verification = step(tokens, start)
        single = start > 0 and tokens.numel() == 1
        if not (dense_feature or dense_kv) or not single or int(verification.outputs[EXIT_LAYER][0]) >= last_layer:
            return verification
        exit_feature = target.feature
        written = [cache[:, :, start].clone() for cache in target.full.cache.tensors]
        full = target.full.prefill(tokens, start)   # writes the dense K/V of every layer at `start`
        target.feature = full.outputs[FEATURE][-1] if dense_feature else exit_feature
        if dense_kv:
            target.early.written_by_full_model(full.slots)
        else:
            for cache, row in zip(target.full.cache.tensors, written):
                cache[:, :, start] = row
        return verification

    return prefill


if __name__ == "__main__":
    sys.exit(main())
