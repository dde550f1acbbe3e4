"""`specc distill-draft`: a small draft model for a target that has no smaller sibling.

Classic speculative decoding (`--method draft-model`) needs a draft that
shares the target's tokenizer, and the smallest model of a family (our
reference, SmolLM2-135M) has none. This builds one from the target itself,
a truncated and self-distilled draft:

1. Truncate: the target's config with `num_hidden_layers = layers` (per-layer
   config lists such as `layer_types` cut to match), initialised from the
   target's embedding, its first `layers` decoder layers, its final norm and
   its LM head (tied embeddings stay tied). Untrained, this is the target
   exiting early: its first layers' state read out by the final norm and head.
2. Self-distil from the frozen target on calibration windows
   (`token_windows`, reply-only held-out masks for `specc distill-data`
   files): soft cross-entropy against the target's top-k next-token
   probabilities, computed once per window (`cache_teacher`).

Only the decoder layers and the final norm train. The embedding and the LM
head stay frozen: they are the target's own rows, the interface both models
share, and the kept layers were trained against them; at vocabulary × hidden
they are also most of a small draft's parameters (SmolLM2-135M's shape:
benchmarks/NOTES.md#smollm2-135m-instruct), and moving them on a few hundred
windows would overfit the tokens those windows happen to contain.

The result is an ordinary Hugging Face checkpoint directory (config,
safetensors, generation config, tokenizer with its chat template) plus
`specc_draft.json` recording how it was made; pass it as
`--set draft_model=DIR`. Written atomically; deterministic for a seed.
"""

from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specc.host.device import resolve_device
from specc.errors import UsageError
from specc.train.distill import DistillConfig, DistillReport, cache_teacher, distill, sparse_target

RECORD_FILE = "specc_draft.json"
PER_LAYER_CONFIG_KEYS = ("layer_types",)   # config lists with one entry per decoder layer
_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class DraftDistillRequest:
    model: str
    output: Path
    layers: int = 4
    calib_data: str | None = None
    train_steps: int = 1000
    train_windows: int = 256
    seq_len: int = 128
    eval_sequences: int = 8
    teacher_top_k: int = 64
    learning_rate: float = 1e-3
    seed: int = 0
    force: bool = False
    device: str = "auto"   # where the target teaches and the draft trains


@dataclass
class DraftDistillReport:
    output: Path
    layers: int
    target_layers: int
    calibration: str
    training: DistillReport
    seconds: float

    def summary(self) -> str:
        before, after = self.training.initial, self.training.final
        return (f"{self.layers} of {self.target_layers} layers; held-out top-1 agreement {before.acceptance:.3f} → "
                f"{after.acceptance:.3f} (soft cross-entropy {before.loss:.3f} → {after.loss:.3f}) after "
                f"{self.training.steps} steps on {self.calibration}; {self.seconds:.1f}s")


def distill_draft(request: DraftDistillRequest) -> DraftDistillReport:
    """Build, train and write the draft; cheap checks run before any weights load."""
    from specc.capture.load import load_model, load_tokenizer
    from specc.train.corpus import token_windows

    start = time.perf_counter()
    _check_request(request)
    device = resolve_device(request.device)
    checkpoint, target_layers = _checked_target(request)
    tokenizer = load_tokenizer(checkpoint)
    windows = token_windows(tokenizer, request.calib_data, request.seq_len, request.train_windows,
                            request.eval_sequences, request.seed,
                            remedy="pass more text with --calib-data FILE or lower --seq-len")
    target = load_model(checkpoint).to(device)
    draft = truncated_draft(target, request.layers).to(device)
    training = train_draft(target, draft, windows, request)
    report = DraftDistillReport(request.output, request.layers, target_layers, windows.source, training,
                                time.perf_counter() - start)
    write_draft(request.output, request.force, draft, tokenizer, _record(request, checkpoint, report))
    report.seconds = time.perf_counter() - start
    return report


def truncated_draft(target, layers: int):
    """A new model of the target's class with its first `layers` decoder layers and
    everything outside the layer stack (embedding, final norm, LM head) copied."""
    from transformers import AutoModelForCausalLM

    config = _truncated_config(target.config, layers)
    draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype, attn_implementation="sdpa")
    kept = {name: tensor for name, tensor in target.state_dict().items() if _kept(name, layers)}
    draft.load_state_dict(kept, strict=True)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def _truncated_config(config, layers: int):
    values = config.to_dict()
    values["num_hidden_layers"] = layers
    for key in PER_LAYER_CONFIG_KEYS:
        if values.get(key) is not None:
            values[key] = list(values[key])[:layers]
    return type(config).from_dict(values)


def _kept(name: str, layers: int) -> bool:
    match = _LAYER_KEY.search(name)
    return match is None or int(match.group(1)) < layers


def trainable_parameters(draft) -> list[torch.nn.Parameter]:
    """Everything but the embedding and the LM head (the target's shared rows):
    the decoder layers and the final norm."""
    frozen = {id(draft.get_input_embeddings().weight), id(draft.get_output_embeddings().weight)}
    return [p for p in draft.parameters() if id(p) not in frozen]


def train_draft(target, draft, windows, request: DraftDistillRequest) -> DistillReport:
    """Self-distil `draft` from the frozen `target`; with no steps, only the held-out
    figures of the untrained draft."""
    for p in target.parameters():
        p.requires_grad_(False)
    for p in draft.parameters():
        p.requires_grad_(False)
    examples = (windows.train if request.train_steps > 0 else []) + windows.heldout
    teacher = cache_teacher(_teacher(target, request.teacher_top_k), examples,
                            "distill-draft: running the target once per window")
    config = DistillConfig(steps=request.train_steps, learning_rate=request.learning_rate,
                           warmup_steps=request.train_steps // 20, seed=request.seed)
    report = distill(_student(draft), teacher, trainable_parameters(draft), windows.train, windows.heldout,
                     config, description="distill-draft: training", heldout_scored=windows.heldout_scored)
    tqdm.write(f"distill-draft: trained on {windows.source}: {report.summary()}")
    return report


def _teacher(target, top_k: int):
    """tokens → (the target's top-k next-token probabilities, tokens)."""
    def teach(tokens: torch.Tensor):
        tokens = tokens.to(target.device)
        logits = target(input_ids=tokens[None], use_cache=False).logits[0]
        return sparse_target(torch.softmax(logits.float(), dim=-1), top_k), tokens
    return teach


def _student(draft):
    def predict(tokens: torch.Tensor) -> torch.Tensor:
        return draft(input_ids=tokens[None], use_cache=False).logits[0]
    return predict


def write_draft(output: Path, force: bool, draft, tokenizer, record: dict) -> None:
    """The checkpoint, built in a sibling directory and renamed over `output` only when whole."""
    from specc.engine.save import staging_dir

    with staging_dir(output, force) as staging:
        draft.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _record(request: DraftDistillRequest, checkpoint: Path, report: DraftDistillReport) -> dict:
    settings = {k: v for k, v in asdict(request).items() if k not in ("model", "output", "force")}
    return {"target": request.model, "target_checkpoint": str(checkpoint), "layers": report.layers,
            "target_layers": report.target_layers, "trained": "decoder layers and final norm (embedding and "
            "LM head frozen: the target's)", "settings": settings, "calibration": report.calibration,
            "training": report.training.to_json(), "seconds": round(report.seconds, 3)}


def _check_request(request: DraftDistillRequest) -> None:
    from specc.engine.save import check_output_dir

    check_output_dir(request.output, request.force)
    for name, least in (("layers", 1), ("train_steps", 0), ("train_windows", 1), ("seq_len", 2),
                        ("eval_sequences", 1), ("teacher_top_k", 1)):
        if getattr(request, name) < least:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(request, name)} must be at least {least}")
    if not request.learning_rate > 0:
        raise UsageError(f"--learning-rate {request.learning_rate} must be positive")
    _check_calib_data(request.calib_data)


def _check_calib_data(value: str | None) -> None:
    from specc.data.prompts import PROMPT_SET_NAMES

    if value is None or value in PROMPT_SET_NAMES:
        return
    if not Path(value).is_file():
        raise UsageError(f"--calib-data {value}: no such file; pass a JSONL or text file (e.g. from `specc "
                         f"distill-data`) or a prompt set name ({', '.join(PROMPT_SET_NAMES)})")


def _checked_target(request: DraftDistillRequest) -> tuple[Path, int]:
    """The target's checkpoint directory and layer count, once `--layers` is known to fit."""
    from transformers import AutoConfig

    from specc.capture.families import check_supported
    from specc.capture.load import read_model_type, resolve_checkpoint

    checkpoint = resolve_checkpoint(request.model)
    check_supported(read_model_type(checkpoint))
    target_layers = AutoConfig.from_pretrained(checkpoint).num_hidden_layers
    if request.layers >= target_layers:
        raise UsageError(f"--layers {request.layers} must be below the target's {target_layers} layers "
                         f"(a draft is a shallower copy); try --layers {max(1, target_layers // 8)}")
    return checkpoint, target_layers
