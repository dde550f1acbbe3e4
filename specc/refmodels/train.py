"""Train one reference model and write it as a Hugging Face checkpoint directory.

The run is seeded end to end (model init, window order), so on one CPU machine
the same spec and corpus give bit-identical weights; CUDA runs are seeded but
not bit-reproducible. On CUDA, and on CPUs with native bf16 units (AVX512-BF16,
AMX) for models of hidden size 256 and up, the forward and backward passes run
under bf16 autocast; the weights stay float32.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specc.console.progress import progress_bar
from specc.data.corpora import CorpusSelection
from specc.data.files import write_directory_atomically
from specc.host.cpuinfo import has_bfloat16_units
from specc.refmodels.specs import REFERENCE_FILE, TRAINER_VERSION, ReferenceSpec, TrainingPlan
from specc.refmodels.tokenizer import encode_documents, endoftext_id, save_tokenizer, train_tokenizer

log = logging.getLogger(__name__)

REFERENCE_FORMAT = 1
_LOSS_CURVE_POINTS = 20


@dataclass(frozen=True)
class TokenStreams:
    train: torch.Tensor  # 1-D int64; documents separated by <|endoftext|>
    heldout: dict[str, torch.Tensor]  # by corpus kind


@dataclass(frozen=True)
class WindowScores:
    loss: float
    accuracy: float


def train_reference_model(
    spec: ReferenceSpec,
    selection: CorpusSelection,
    destination: Path,
    *,
    cache_key: str,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> dict:
    """Train ``spec`` on ``selection`` and write the checkpoint to ``destination``.

    Returns the record written to ``specc_reference.json``.
    """
    build_started = time.perf_counter()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    log.info("training a %d-token BPE tokenizer", spec.tokenizer.vocab_size)
    tokenizer = train_tokenizer(
        (doc.text for doc in selection.tokenizer_sample), spec.tokenizer.vocab_size
    )
    streams = _encode_streams(tokenizer, selection)
    _check_streams_fit(streams, spec.training.seq_len)

    torch.manual_seed(spec.training.seed)
    model = build_model(spec, vocab_size=tokenizer.get_vocab_size(), special_id=endoftext_id(tokenizer))
    metrics = _train_and_score(model.to(device), streams, spec, device, progress)
    metrics["build_seconds"] = round(time.perf_counter() - build_started, 2)

    reference = {
        "format": REFERENCE_FORMAT,
        "name": spec.name,
        "cache_key": cache_key,
        "trainer_version": TRAINER_VERSION,
        "spec": spec.as_dict(),
        "corpus": _describe_corpus(selection, streams),
        "metrics": metrics,
        "training": {
            "device": device.type,
            "precision": _precision_name(_autocast_dtype(device, spec.model.hidden_size)),
        },
        "versions": _versions(),
    }

    def write_contents(directory: Path) -> None:
        save_tokenizer(tokenizer, directory, model_max_length=spec.model.max_position_embeddings)
        with _hf_progress_bars(progress):
            model.to("cpu").save_pretrained(directory)
        (directory / REFERENCE_FILE).write_text(json.dumps(reference, indent=2) + "\n")

    write_directory_atomically(destination, write_contents)
    return reference


def _train_and_score(
    model: torch.nn.Module,
    streams: TokenStreams,
    spec: ReferenceSpec,
    device: torch.device,
    progress: bool,
) -> dict:
    autocast_dtype = _autocast_dtype(device, spec.model.hidden_size)

    def score(stream: torch.Tensor) -> WindowScores:
        return _score_windows(model, stream, spec.training, device, autocast_dtype)

    initial_val = _mean_scores([score(stream) for stream in streams.heldout.values()])
    started = time.perf_counter()
    loss_curve = _optimize(model, streams.train, spec, device, autocast_dtype, progress)
    train_seconds = time.perf_counter() - started
    val_by_kind = {kind: score(stream) for kind, stream in streams.heldout.items()}
    val, train = _mean_scores(list(val_by_kind.values())), score(streams.train)
    plan = spec.training
    return {
        "train_loss": train.loss,
        "train_accuracy": train.accuracy,
        "val_loss": val.loss,
        "val_accuracy": val.accuracy,
        "initial_val_loss": initial_val.loss,
        "val_by_kind": {kind: dataclasses.asdict(scores) for kind, scores in val_by_kind.items()},
        "train_seconds": round(train_seconds, 2),
        "tokens_seen": plan.steps * plan.batch_size * plan.seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_curve": loss_curve,
    }


def build_model(spec: ReferenceSpec, vocab_size: int, special_id: int) -> torch.nn.Module:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = spec.model
    common = dict(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=special_id,
        eos_token_id=special_id,
        pad_token_id=special_id,
        dtype="float32",
    )
    if shape.family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    model.generation_config = GenerationConfig(
        bos_token_id=special_id, eos_token_id=special_id, pad_token_id=special_id
    )
    return model


# --- data --------------------------------------------------------------------


def _encode_streams(tokenizer, selection: CorpusSelection) -> TokenStreams:
    log.info("encoding the corpus")
    train_texts = [doc.text for docs in selection.train.values() for doc in docs]
    heldout = {
        kind: torch.tensor(encode_documents(tokenizer, [doc.text for doc in docs]), dtype=torch.long)
        for kind, docs in selection.heldout.items()
    }
    return TokenStreams(torch.tensor(encode_documents(tokenizer, train_texts), dtype=torch.long), heldout)


def _check_streams_fit(streams: TokenStreams, seq_len: int) -> None:
    for name, stream in [("train", streams.train), *streams.heldout.items()]:
        if len(stream) <= seq_len:
            raise ValueError(
                f"the {name} corpus has {len(stream)} tokens, too few for {seq_len}-token windows"
            )


def _random_windows(stream: torch.Tensor, plan: TrainingPlan, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - plan.seq_len, (plan.batch_size,), generator=generator)
    return stream[starts[:, None] + torch.arange(plan.seq_len + 1)]


def _evenly_spaced_windows(stream: torch.Tensor, count: int, seq_len: int) -> torch.Tensor:
    starts = torch.linspace(0, len(stream) - seq_len - 1, count).long()
    return stream[starts[:, None] + torch.arange(seq_len + 1)]


# --- optimization ------------------------------------------------------------


def _optimize(
    model: torch.nn.Module,
    stream: torch.Tensor,
    spec: ReferenceSpec,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    progress: bool,
) -> list[list[float]]:
    """Run the training steps; returns ``[[last_step, mean_loss], ...]`` over equal intervals."""
    plan = spec.training
    model.train()
    optimizer = torch.optim.AdamW(
        _parameter_groups(model, plan.weight_decay), lr=plan.learning_rate, betas=(0.9, 0.95)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(plan))
    generator = torch.Generator().manual_seed(plan.seed)
    losses: list[float] = []
    bar = progress_bar(range(plan.steps), desc=f"training {spec.name}", unit="step", disable=not progress)
    for step in bar:
        windows = _random_windows(stream, plan, generator).to(device)
        with _autocast(device, autocast_dtype):
            loss = _next_token_loss(model, windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == plan.steps - 1:
            bar.set_postfix(loss=f"{sum(losses[-10:]) / len(losses[-10:]):.3f}", refresh=False)
    bar.close()
    model.eval()
    return _loss_curve(losses)


def _parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    # Decay matrices only; norm gains and biases pull towards 0 for no benefit.
    matrices = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": vectors, "weight_decay": 0.0}]


def warmup_cosine(plan: TrainingPlan) -> Callable[[int], float]:
    def multiplier(step: int) -> float:
        if step < plan.warmup_steps:
            return (step + 1) / plan.warmup_steps
        decay_steps = max(1, plan.steps - plan.warmup_steps)
        progress = min(1.0, (step - plan.warmup_steps) / decay_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return plan.min_lr_ratio + (1 - plan.min_lr_ratio) * cosine

    return multiplier


def _next_token_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=windows[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())


def _loss_curve(losses: list[float]) -> list[list[float]]:
    points = min(_LOSS_CURVE_POINTS, len(losses))
    bounds = [round(i * len(losses) / points) for i in range(points + 1)]
    return [
        [end, round(sum(losses[start:end]) / (end - start), 4)]
        for start, end in zip(bounds, bounds[1:])
    ]


# --- evaluation --------------------------------------------------------------


@torch.no_grad()
def _score_windows(
    model: torch.nn.Module,
    stream: torch.Tensor,
    plan: TrainingPlan,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
) -> WindowScores:
    windows = _evenly_spaced_windows(stream, plan.eval_windows, plan.seq_len)
    total_loss, correct, count = 0.0, 0, 0
    for batch in windows.split(plan.batch_size):
        batch = batch.to(device)
        targets = batch[:, 1:]
        with _autocast(device, autocast_dtype):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits.float()
        total_loss += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == targets).sum().item()
        count += targets.numel()
    return WindowScores(loss=round(total_loss / count, 4), accuracy=round(correct / count, 4))


def _mean_scores(scores: list[WindowScores]) -> WindowScores:
    # Every kind is scored on the same number of windows, so a plain mean weights tokens equally.
    return WindowScores(
        loss=round(sum(s.loss for s in scores) / len(scores), 4),
        accuracy=round(sum(s.accuracy for s in scores) / len(scores), 4),
    )


# --- precision ---------------------------------------------------------------


# On a CPU, bf16 autocast pays off only once the matmuls are large enough: on a
# Sapphire Rapids core it trains hidden-256 models 1.5x faster but hidden-128
# ones about 13% slower than float32.
_CPU_BF16_MIN_HIDDEN_SIZE = 256


def _autocast_dtype(device: torch.device, hidden_size: int) -> torch.dtype | None:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu" and hidden_size >= _CPU_BF16_MIN_HIDDEN_SIZE and has_bfloat16_units():
        return torch.bfloat16
    return None


def _precision_name(autocast_dtype: torch.dtype | None) -> str:
    return "float32" if autocast_dtype is None else f"{str(autocast_dtype).removeprefix('torch.')} autocast"


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


# --- checkpoint --------------------------------------------------------------


@contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    silenced = not enabled and hf_logging.is_progress_bar_enabled()
    if silenced:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if silenced:
            hf_logging.enable_progress_bar()


def _describe_corpus(selection: CorpusSelection, streams: TokenStreams) -> dict:
    return {
        "fingerprint": selection.fingerprint(),
        "train_tokens": len(streams.train),
        "heldout_tokens": {kind: len(stream) for kind, stream in streams.heldout.items()},
        "train_documents": {kind: len(docs) for kind, docs in selection.train.items()},
        "heldout_documents": {kind: len(docs) for kind, docs in selection.heldout.items()},
        "tokenizer_documents": len(selection.tokenizer_sample),
    }


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    import specc

    return {
        "specc": specc.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
