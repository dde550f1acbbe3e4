"""Specifications of the reference models: shape, corpus, tokenizer and training plan.

Every built-in spec shares one tokenizer spec. The BPE trainer is
deterministic, so all reference models get byte-identical vocabularies and any
smaller one can serve as a draft model for a larger one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["llama", "qwen2"]

# Part of every cache key: bump it when the trainer's output changes for an unchanged spec.
TRAINER_VERSION = 1
# Written last into every checkpoint; its presence with the right cache key marks the build complete.
REFERENCE_FILE = "specc_reference.json"


@dataclass(frozen=True)
class TokenizerSpec:
    """A byte-level BPE trained on the first bytes of the training corpora."""

    vocab_size: int = 4096
    code_bytes: int = 3_000_000
    text_bytes: int = 3_000_000


@dataclass(frozen=True)
class ModelShape:
    family: Family = "llama"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10_000.0
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class CorpusPlan:
    """How many bytes of each corpus the model trains on (0 leaves a corpus out)."""

    code_bytes: int = 2_000_000
    text_bytes: int = 1_500_000


@dataclass(frozen=True)
class TrainingPlan:
    steps: int = 800
    batch_size: int = 4
    seq_len: int = 128
    learning_rate: float = 4e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 80
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_windows: int = 32  # per held-out corpus kind, and as many train windows


@dataclass(frozen=True)
class ReferenceSpec:
    name: str
    description: str
    model: ModelShape = field(default_factory=ModelShape)
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    corpus: CorpusPlan = field(default_factory=CorpusPlan)
    training: TrainingPlan = field(default_factory=TrainingPlan)

    def __post_init__(self) -> None:
        problems = spec_problems(self)
        if problems:
            raise ValueError(f"invalid reference spec {self.name!r}: " + "; ".join(problems))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """A stable hash of every field, the first ingredient of the cache key."""
        canonical = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def spec_problems(spec: ReferenceSpec) -> list[str]:
    shape, plan = spec.model, spec.training
    problems = []
    if shape.family not in ("llama", "qwen2"):
        problems.append(f"family must be 'llama' or 'qwen2', not {shape.family!r}")
    if shape.hidden_size % shape.num_heads:
        problems.append("hidden_size must be a multiple of num_heads")
    if shape.num_heads % shape.num_kv_heads:
        problems.append("num_heads must be a multiple of num_kv_heads")
    if plan.seq_len > shape.max_position_embeddings:
        problems.append("seq_len must not exceed max_position_embeddings")
    if spec.corpus.code_bytes <= 0 and spec.corpus.text_bytes <= 0:
        problems.append("the corpus plan includes neither code nor text")
    if plan.steps < 1 or plan.batch_size < 1 or plan.eval_windows < 1:
        problems.append("steps, batch_size and eval_windows must be positive")
    if not 0 <= plan.warmup_steps <= plan.steps:
        problems.append("warmup_steps must lie between 0 and steps")
    return problems


def parameter_count(spec: ReferenceSpec) -> int:
    """Parameters of the model the spec describes, computed without building it."""
    shape = spec.model
    hidden, vocab = shape.hidden_size, spec.tokenizer.vocab_size
    kv_width = shape.num_kv_heads * shape.head_dim
    attention = 2 * hidden * hidden + 2 * hidden * kv_width
    if shape.family == "qwen2":
        attention += hidden + 2 * kv_width  # Qwen2 puts biases on q, k and v
    mlp = 3 * hidden * shape.intermediate_size
    per_layer = attention + mlp + 2 * hidden  # two RMSNorm weights
    embeddings = vocab * hidden * (1 if shape.tie_word_embeddings else 2)
    return embeddings + shape.num_layers * per_layer + hidden


SHARED_TOKENIZER = TokenizerSpec(vocab_size=4096, code_bytes=3_000_000, text_bytes=3_000_000)
WHOLE_CORPUS = CorpusPlan(code_bytes=50_000_000, text_bytes=50_000_000)

_BUILTIN_SPECS = (
    ReferenceSpec(
        name="tiny",
        description="4-layer llama for tests and the quick start; under a minute on 2 idle CPU cores.",
        model=ModelShape(
            family="llama",
            hidden_size=128,
            intermediate_size=384,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            max_position_embeddings=512,
        ),
        tokenizer=SHARED_TOKENIZER,
        corpus=CorpusPlan(code_bytes=2_000_000, text_bytes=1_500_000),
        training=TrainingPlan(
            steps=800, batch_size=4, seq_len=128, learning_rate=4e-3, warmup_steps=80
        ),
    ),
    ReferenceSpec(
        name="small",
        description="8-layer llama, the default benchmark model; about 14 minutes on 2 idle CPU cores.",
        model=ModelShape(
            family="llama",
            hidden_size=256,
            intermediate_size=704,
            num_layers=8,
            num_heads=4,
            num_kv_heads=2,
            max_position_embeddings=1024,
        ),
        tokenizer=SHARED_TOKENIZER,
        corpus=WHOLE_CORPUS,
        training=TrainingPlan(
            steps=2000, batch_size=8, seq_len=256, learning_rate=1.5e-3, warmup_steps=100
        ),
    ),
    ReferenceSpec(
        name="small-qwen2",
        description="8-layer qwen2 (qkv biases, tied embeddings); about 11 minutes on 2 idle CPU cores.",
        model=ModelShape(
            family="qwen2",
            hidden_size=256,
            intermediate_size=704,
            num_layers=8,
            num_heads=4,
            num_kv_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        ),
        tokenizer=SHARED_TOKENIZER,
        corpus=WHOLE_CORPUS,
        training=TrainingPlan(
            steps=1600, batch_size=8, seq_len=256, learning_rate=1.5e-3, warmup_steps=100, seed=1
        ),
    ),
    ReferenceSpec(
        name="medium",
        description=(
            "12-layer llama meant for a GPU (used when one is present): minutes there, about "
            "5.5 hours on 2 CPU cores. It sees the ~6M-token corpus about 4 times."
        ),
        model=ModelShape(
            family="llama",
            hidden_size=512,
            intermediate_size=1408,
            num_layers=12,
            num_heads=8,
            num_kv_heads=4,
            max_position_embeddings=2048,
        ),
        tokenizer=SHARED_TOKENIZER,
        corpus=WHOLE_CORPUS,
        training=TrainingPlan(
            steps=1500,
            batch_size=32,
            seq_len=512,
            learning_rate=6e-4,
            warmup_steps=150,
            eval_windows=64,
        ),
    ),
)

REFERENCE_MODELS: dict[str, ReferenceSpec] = {spec.name: spec for spec in _BUILTIN_SPECS}
