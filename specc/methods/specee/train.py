"""SpecEE's compile-time step: draft head, exit predictors, offline schedule, quality.

1. The draft head is self-distilled from the frozen target (`verify` on a
   window gives the next-token distribution and the top-layer features);
   its LM head is first cut to the most frequent calibration tokens (the
   head graph built again with them as state: its recipe's `after_training`
   pass cuts it, as in the engine).
2. On `predictor_windows` windows the layer-wise target runs once with the
   trained head's candidates; after every layer the full head gives the
   features [z, p, Δ] and the label "this layer's argmax is the final
   token". One MLP per layer learns it (BCE, Adam).
3. On the next `threshold_windows` training windows, which the predictors
   never saw, the exit threshold is calibrated (fitted on the predictors'
   own samples it reads high and exits too often on new text); each
   position's first guarded exit there gives the exit-layer histogram and
   the offline schedule is its most frequent layers.
   Held-out windows give teacher-forced quality: the share of positions
   whose early-exit token is the dense token, and mean layers executed.
"""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from specc.console.progress import progress_bar
from specc.contract.descriptor import TrainingContext, TrainResult
from specc.methods.specee.config import DRAFT_VOCABULARY_KEY, REDUCED_HEAD, SCHEDULE_KEY, SpecEEConfig
from specc.methods.specee.layerwise import LayerwiseForward
from specc.methods.specee.attach_draft_head import DraftHeadConfig
from specc.methods.specee.insert_exit_predictors import (MODULE, apply_predictor, predictor_features,
                                                         predictor_parameters)
from specc.train.corpus import token_windows
from specc.train.inputs import decoding_inputs, empty_caches
from specc.train.vocabulary import frequent_tokens, student_index
from specc.train.distill import DistillConfig, PackedTeacher, cache_teacher, distill, sparse_target
from specc.train.heap import releasing
from specc.train.packing import packed_decoding_inputs, tokens_per_call, unpack

HEAD_MODULE = DraftHeadConfig().module_name
CALIBRATION_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98, 0.985, 0.99, 0.993,
                          0.995, 0.997, 0.998, 0.999, 0.9995, 0.9999)


def train_specee(context: TrainingContext, config: SpecEEConfig, tokenizer) -> TrainResult:
    program = context.program
    arch = program.graphs["verify"].architecture
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, config.train_windows,
                            config.eval_sequences, config.seed)
    state: dict = {"calibration": windows.source}
    vocabulary = None
    if 0 < config.draft_vocab_size < arch.vocab_size:
        vocabulary = frequent_tokens(windows.train, arch, config.draft_vocab_size)
        state[DRAFT_VOCABULARY_KEY] = vocabulary
    head, verify = _draft_head(context, config, vocabulary), program.graphs["verify"].module
    dtype = next(head.parameters()).dtype
    to_student = None if vocabulary is None else student_index(vocabulary, arch.vocab_size)
    teacher = cache_teacher(window_teacher(verify, arch, dtype, config.teacher_top_k, to_student),
                            windows.train + windows.heldout, "specee: running the target once per window")
    trainable = _head_parameters(head)
    for name, p in head.named_parameters():
        p.requires_grad_(name in trainable)
    if config.train_steps > 0:
        report = distill(_student(head, arch, dtype), teacher, list(trainable.values()), windows.train,
                         windows.heldout,
                         DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                       warmup_steps=config.warmup_steps, eval_every=config.eval_every,
                                       seed=config.seed),
                         description="specee: training draft head", heldout_scored=windows.heldout_scored)
        tqdm.write(f"specee: draft head trained on {windows.source}: {report.summary()}")
        state["draft_head_training"] = report.to_json()
    vocab_ids = None if vocabulary is None else torch.tensor(vocabulary)
    layerwise_gm = program.graphs["layerwise"].module
    layerwise = LayerwiseForward(layerwise_gm, lambda segment: segment, "propagate", arch.sliding_window)
    start = time.perf_counter()
    def collect(chosen, scored, what: str) -> _Samples:
        return _collect(layerwise, head, teacher, chosen, arch, dtype, config.candidates, vocab_ids,
                        f"specee: scoring every layer ({what})", scored)

    first, calibration = predictor_and_threshold_slices(len(windows.train), config)
    train_samples = collect(windows.train[first], _sliced(windows.train_scored, first), "train")
    threshold_samples = (collect(windows.train[calibration], _sliced(windows.train_scored, calibration),
                                 "threshold") if calibration else train_samples)
    heldout_samples = collect(windows.heldout, windows.heldout_scored, "held-out")
    predictors = _train_predictors(layerwise_gm, layerwise.scored_layers, train_samples, config)
    schedule = _schedule(layerwise_gm, layerwise.scored_layers, threshold_samples, heldout_samples, config, arch)
    schedule["threshold_positions"] = int(threshold_samples.final.numel())
    state[SCHEDULE_KEY] = schedule
    state["predictor_training"] = {**predictors, "seconds": round(time.perf_counter() - start, 3)}
    tqdm.write(f"specee: exit threshold {schedule['threshold']}, offline schedule {schedule['offline']}; "
               f"held-out teacher-forced agreement "
               f"{schedule['heldout']['agreement']:.3f}, mean layers {schedule['heldout']['mean_layers']:.2f} "
               f"of {arch.num_layers}, exit rate {schedule['heldout']['exit_rate']:.3f}")
    weights = {name: p.detach().clone() for name, p in head.named_parameters()
               if name.startswith((HEAD_MODULE + ".", REDUCED_HEAD + "."))}
    weights |= {name: p.detach().clone() for name, p in layerwise_gm.named_parameters()
                if name.startswith(MODULE + ".")}
    return TrainResult(weights, state)


def predictor_and_threshold_slices(train_count: int, config: SpecEEConfig) -> tuple[slice, slice | None]:
    """The predictors' training windows, then the threshold's (None if no window is left for it:
    the threshold is then fitted on the predictors' own samples)."""
    first = slice(0, config.predictor_windows)
    end = min(train_count, config.predictor_windows + config.threshold_windows)
    return first, (slice(config.predictor_windows, end) if end > config.predictor_windows else None)


def _sliced(scored: list | None, part: slice) -> list | None:
    return None if scored is None else scored[part]


def _draft_head(context: TrainingContext, config: SpecEEConfig, vocabulary: list[int] | None):
    """The draft head graph, its LM head cut to `vocabulary` (None: the whole head)."""
    if vocabulary is None:
        return context.program.graphs["draft_head"].module
    reduced = context.build(config, {DRAFT_VOCABULARY_KEY: vocabulary}, names=("draft_head",))
    return reduced.graphs["draft_head"].module


def _head_parameters(head: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in head.named_parameters() if name.startswith(HEAD_MODULE + ".")}


def window_teacher(verify, arch, dtype, top_k: int, to_student) -> PackedTeacher:
    """windows → per window (the target's top-k next-token probabilities, (tokens,
    previous-token features, the target's argmax)), several windows a call."""
    device = next(verify.parameters()).device

    def teach(windows: list[torch.Tensor]):
        inputs = packed_decoding_inputs(windows, arch.sliding_window)
        logits, features = verify(*inputs, *empty_caches(arch, arch.num_layers, inputs[0].numel(), dtype, device))
        targets = sparse_target(torch.softmax(logits[0].float(), dim=-1), top_k, to_student).split(
            [w.numel() for w in windows])
        return [(target, (tokens, torch.cat([torch.zeros_like(f[:1]), f[:-1]])[None], top1))
                for target, tokens, f, top1 in zip(targets, windows, unpack(features[0], windows),
                                                   unpack(logits[0].argmax(-1), windows))]
    return PackedTeacher(teach, tokens_per_call(device))


def _student(head, arch, dtype):
    def predict(lesson) -> torch.Tensor:
        tokens, features, _ = lesson
        logits = head(*decoding_inputs(tokens, arch.sliding_window), *empty_caches(arch, 1, tokens.numel(), dtype), features)[0]
        return logits[0]
    return predict


class _Samples:
    """Per scored layer: features [N, 3K], labels [N], the guard [N] and the layer's argmax [N]."""

    def __init__(self, layers):
        self.features = {l: [] for l in layers}
        self.labels = {l: [] for l in layers}
        self.guard = {l: [] for l in layers}
        self.final: list[torch.Tensor] = []

    def done(self) -> "_Samples":
        for table in (self.features, self.labels, self.guard):
            for layer in table:
                table[layer] = torch.cat(table[layer])
        self.final = torch.cat(self.final)
        return self


def _collect(layerwise: LayerwiseForward, head, teacher, windows, arch, dtype, k: int, vocab_ids, description,
             scored=None):
    """Per-layer samples at every position of `windows`, or only where `scored` (per window,
    bool [T]) marks one: predictors and the threshold then fit the replies, not the prompts."""
    samples = _Samples(layerwise.scored_layers)
    for index, tokens in enumerate(releasing(progress_bar(windows, desc=description, unit="window"))):
        keep = slice(None) if scored is None else scored[index]
        with torch.no_grad():
            _, (_, features, final) = teacher(tokens)
            head_logits = head(*decoding_inputs(tokens, arch.sliding_window), *empty_caches(arch, 1, tokens.numel(), dtype), features)[0]
            candidates = head_logits[0].topk(k, dim=-1).indices
            if vocab_ids is not None:
                candidates = vocab_ids[candidates]
            inputs = (*decoding_inputs(tokens, arch.sliding_window), *empty_caches(arch, arch.num_layers, tokens.numel(), dtype), candidates)
            hidden: dict[int, torch.Tensor] = {}
            layerwise.run(inputs, watch=lambda i, h: hidden.__setitem__(i, h))
            reduced_below = None
            for layer in range(arch.num_layers - 1):
                logits = layerwise.head(hidden[layer], inputs)[0].float()
                z = logits.gather(-1, candidates)
                if layer in samples.features:
                    top = logits.argmax(-1)
                    samples.features[layer].append(predictor_features(z, reduced_below)[keep])
                    samples.labels[layer].append((top == final).float()[keep])
                    samples.guard[layer].append((candidates == top[:, None]).any(-1)[keep])
                reduced_below = z
            samples.final.append(final[keep])
    return samples.done()


def _train_predictors(gm, layers, samples: _Samples, config: SpecEEConfig) -> dict:
    generator = torch.Generator().manual_seed(config.seed)
    report = {}
    for layer in progress_bar(layers, desc="specee: training exit predictors", unit="layer"):
        predictor = predictor_parameters(gm, layer)
        x, y = samples.features[layer], samples.labels[layer]
        # float32 masters: Adam's small steps vanish in a bfloat16 weight
        master = {name: p.detach().float().requires_grad_(True) for name, p in predictor.items()}
        with torch.enable_grad():
            optimizer = torch.optim.Adam(master.values(), lr=config.predictor_learning_rate)
            for _ in range(config.predictor_epochs):
                for batch in torch.randperm(len(y), generator=generator).split(256):
                    loss = torch.nn.functional.binary_cross_entropy(_score(master, x[batch]), y[batch])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        with torch.no_grad():
            for name, p in predictor.items():
                p.copy_(master[name])
            fired = _score(predictor, x) > 0.5
        report[str(layer)] = {"positives": round(float(y.mean()), 4),
                              "accuracy": round(float((fired == (y > 0.5)).float().mean()), 4)}
    return {"layers": report}


def _score(predictor: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
    dtype = predictor["fc1.weight"].dtype
    return apply_predictor(predictor, features.to(dtype)).squeeze(-1).float()


def _exit_layers(gm, layers, samples: _Samples, schedule, threshold: float, last: int) -> torch.Tensor:
    """Each position's first scheduled layer where the predictor fires and the guard holds."""
    exits = torch.full_like(samples.final, last)
    decided = torch.zeros_like(samples.final, dtype=torch.bool)
    with torch.no_grad():
        for layer in layers:
            if layer not in schedule:
                continue
            fired = _score(predictor_parameters(gm, layer), samples.features[layer]) > threshold
            leave = fired & samples.guard[layer] & ~decided
            exits[leave] = layer
            decided |= leave
    return exits


def _schedule(gm, layers, calibration: _Samples, heldout: _Samples, config: SpecEEConfig, arch) -> dict:
    last = arch.num_layers - 1
    threshold, exits = _calibrated_threshold(gm, layers, calibration, config, last)
    histogram = {int(l): int((exits == l).sum()) for l in layers}
    size = config.offline_layers or max(1, arch.num_layers // 4)
    offline = sorted(sorted(layers, key=lambda l: (histogram[l], l), reverse=True)[:size])
    held = _exit_layers(gm, layers, heldout, set(offline), threshold, last)
    return {"threshold": threshold, "calibration_agreement": _agreement(calibration, exits, last),
            "offline": offline, "histogram": histogram,
            "heldout": {"agreement": _agreement(heldout, held, last),
                        "mean_layers": round(float((held + 1).float().mean()), 3),
                        "exit_rate": round(float((held < last).float().mean()), 4),
                        "positions": int(held.numel())}}


def _calibrated_threshold(gm, layers, calibration: _Samples, config: SpecEEConfig, last: int):
    """The configured threshold, or the lowest candidate whose teacher-forced agreement on the
    calibration samples (every predictor layer scheduled) reaches the target."""
    candidates = [config.exit_threshold] if config.exit_threshold > 0 else list(CALIBRATION_THRESHOLDS)
    for threshold in candidates:
        exits = _exit_layers(gm, layers, calibration, set(layers), threshold, last)
        if _agreement(calibration, exits, last) >= config.target_agreement:
            break
    return threshold, exits


def _agreement(samples: _Samples, exits: torch.Tensor, last: int) -> float:
    """Teacher-forced: the share of positions whose exit token is the dense token."""
    agree = torch.ones_like(exits, dtype=torch.bool)
    for layer, labels in samples.labels.items():
        at = exits == layer
        agree[at] = labels[at] > 0.5
    return round(float(agree.float().mean()), 4)
