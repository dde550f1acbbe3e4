"""FIRP's draft accuracy against the paper's two alternatives, per prediction step (its Fig. 3, in miniature).

Held-out text, teacher-forced: at each anchor position p, each method predicts
the token at p + i + 1 (step i = 1..k), and is scored against the target's
own greedy choice there (the argmax of its distribution at real position
p + i): the share of draft tokens greedy verification would accept at
that step, given the earlier steps right.

- `firp`: the trained pseudo-hidden projections W_i at layers t_i, run
  through the target's upper layers as at inference (the compile-time
  student: `specc.methods.firp.train.PseudoStudent`);
- `early_exit`: layer t_i's hidden state of p → a d×d linear map (+ bias) →
  the final norm → the LM head. `untrained`: the identity map (the
  intermediate layer's own next-token guess); `trained`: the map learned
  with FIRP's objective, data and budget;
- `medusa`: the last layer's normed hidden state of p → a residual block
  h + SiLU(W h + b) (Medusa-1's head, sharing the frozen LM head) → the LM
  head. `untrained` (W = 0) is the target's next-token prediction reused for
  every step; `trained` as above.

All trained maps have FIRP's parameter count per step (d² + d), are trained
with the same soft-label loss towards the same targets, on the same windows,
steps and learning rate (`specc.train.distill`).

    python benchmarks/firp_accuracy.py ENGINE_OR_MODEL [--set train_steps=150] [--set calib_data=FILE]
        [--output FILE.json]

ENGINE_OR_MODEL: a `firp` engine (its trained projections and config are
used; --set overrides the baselines' training) or a Hugging Face checkpoint
(FIRP is trained in memory with --set first, as `specc compile` would).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a firp engine directory or a model checkpoint")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    report = measure(args.source, args.settings)
    print(table(report))
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def measure(source: Path, settings: list[str] = ()) -> dict:
    from specc.capture.load import load_model, load_tokenizer
    from specc.methods.firp import FIRPConfig
    from specc.compiler import build_program, training_context
    from specc.contract.descriptor import get_method
    from specc.methods.firp.train import (PseudoStudent, WindowTeacher, deep_cuts, projection_tensors, teacher_graph,
                                          train_projections)
    from specc.train.corpus import token_windows
    from specc.train.distill import evaluate

    torch.manual_seed(0)
    if (source / "manifest.json").exists():
        from specc.bench.baselines import source_checkpoint
        from specc.engine.loaded import load_engine

        engine = load_engine(source, backend="eager")
        if engine.method.name != "firp":
            raise SystemExit(f"{source} is a {engine.method.name!r} engine; pass a firp engine or a checkpoint")
        overrides = dict(item.split("=", 1) for item in settings)
        config = FIRPConfig.from_json({**engine.config.to_json(), **overrides})
        checkpoint, tokenizer = source_checkpoint(engine.manifest), engine.tokenizer
        target, arch = engine.context.modules["target"], engine.context.architectures["target"]
        firp_training = engine.method_state.get("training")
        # The students' cuts come from the checkpoint in the engine's dtype; they read the engine's projections.
        source_models = {"target": load_model(checkpoint, engine.manifest["dtype"])}

        def build(recipes):
            return build_program(source_models, get_method("firp"), config, config.train_seq_len, recipes=recipes)
    else:
        config = FIRPConfig.from_assignments(list(settings))
        checkpoint, tokenizer = source, load_tokenizer(source)
        context = training_context({"target": load_model(source)}, get_method("firp"), config, config.train_seq_len)
        firp_training = train_projections(context, config, tokenizer).state.get("training")
        target, arch = context.program.graphs["target"].module, context.program.graphs["target"].architecture

        def build(recipes):
            return context.build_graphs(recipes, config)
    model = load_model(checkpoint).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    layers = config.pass_config().resolve(arch.num_layers)
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, config.train_windows,
                            config.eval_sequences, config.seed)
    teacher = WindowTeacher(teacher_graph(build, target, layers), arch, layers, config.teacher_top_k)
    train = [_with_final_hidden(teacher(w), model) for w in windows.train]
    heldout = [_with_final_hidden(teacher(w), model) for w in windows.heldout]
    parameters = projection_tensors(target)
    cuts = deep_cuts(build, target, layers)
    steps = []
    for i, t in enumerate(layers, start=1):
        firp = PseudoStudent(cuts[t], t, i, parameters[f"firp_proj.{i}.weight"], parameters[f"firp_proj.{i}.bias"])
        row = {"step": i, "layer": t, "firp": round(evaluate(firp, firp.teacher, heldout, 0).acceptance, 4)}
        for name, head in (("early_exit", EarlyExitHead(model, t, arch.hidden_size)),
                           ("medusa", MedusaHead(model, arch.hidden_size))):
            student = lambda window, head=head: head(window, i)   # noqa: E731
            report = _train(student, firp.teacher, head.parameters(), train, heldout, config, f"{name} step {i}")
            row[name] = {"untrained": round(report.initial.acceptance, 4),
                         "trained": round(report.final.acceptance, 4)}
        steps.append(row)
    return {"source": str(source), "checkpoint": str(checkpoint), "calibration": windows.source,
            "heldout_windows": len(heldout), "train_seq_len": config.train_seq_len,
            "train_steps": config.train_steps, "learning_rate": config.learning_rate,
            "layers": list(layers), "parameters_per_step": arch.hidden_size ** 2 + arch.hidden_size,
            "metric": "held-out teacher-forced top-1 agreement with the target's greedy token at p + i + 1",
            "steps": steps, "firp_training": firp_training}


def _with_final_hidden(window, model):
    """The target's last-layer normed hidden state of every position, beside the FIRP teacher's outputs."""
    with torch.no_grad():
        out = model(window.tokens[None], output_hidden_states=True, use_cache=False)
        final = out.hidden_states[-1][0]
        torch.testing.assert_close(model.lm_head(final), out.logits[0], rtol=1e-4, atol=1e-4)
    window.hidden["final"] = final
    return window


class EarlyExitHead:
    """Layer t's hidden state → W h + b (identity, zero at first) → final norm → LM head."""

    def __init__(self, model, layer: int, hidden: int):
        self.model, self.layer = model, layer
        self.linear = torch.nn.Linear(hidden, hidden)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(hidden))
            self.linear.bias.zero_()

    def parameters(self):
        return list(self.linear.parameters())

    def __call__(self, window, step: int) -> torch.Tensor:
        rows = window.tokens.numel() - step
        return self.model.lm_head(self.model.model.norm(self.linear(window.hidden[self.layer][:rows])))


class MedusaHead:
    """The last layer's normed hidden state h → h + SiLU(W h + b) (W, b zero at first) → LM head."""

    def __init__(self, model, hidden: int):
        self.model = model
        self.linear = torch.nn.Linear(hidden, hidden)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def parameters(self):
        return list(self.linear.parameters())

    def __call__(self, window, step: int) -> torch.Tensor:
        rows = window.tokens.numel() - step
        h = window.hidden["final"][:rows]
        return self.model.lm_head(h + torch.nn.functional.silu(self.linear(h)))


def _train(student, teacher, parameters, train, heldout, config, description: str):
    from specc.train.distill import DistillConfig, distill

    return distill(student, teacher, parameters, train, heldout,
                   DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                 warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                                 grad_clip=config.grad_clip, eval_every=max(1, config.train_steps),
                                 seed=config.seed),
                   description=description)


def table(report: dict) -> str:
    lines = [f"{report['metric']}; {report['heldout_windows']} held-out windows of {report['train_seq_len']} "
             f"tokens ({report['calibration']}); trained maps: {report['train_steps']} steps, "
             f"{report['parameters_per_step']} parameters per step",
             f"{'step':>4} {'layer':>5} {'firp':>7} {'exit(untr.)':>12} {'exit(tr.)':>10} {'medusa(untr.)':>14} "
             f"{'medusa(tr.)':>12}"]
    for row in report["steps"]:
        lines.append(f"{row['step']:>4} {row['layer']:>5} {row['firp']:>7.3f} {row['early_exit']['untrained']:>12.3f} "
                     f"{row['early_exit']['trained']:>10.3f} {row['medusa']['untrained']:>14.3f} "
                     f"{row['medusa']['trained']:>12.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
