"""The exactness matrix: every lossless method × family × backend, on tiny checkpoints
that carry each family's real quirks (`specc.testing.checkpoints.QUIRKS`).

A cell compiles one engine and decodes a fixed set of prompts greedily. In float32 it
must be token-identical to Hugging Face `generate(do_sample=False)`; in bfloat16, to
the bfloat16 `none` engine of the same backend (and the same `--quantize` scheme, for
the quantized column). A cell the backend or method cannot
serve is a compile-time refusal (`UsageError`) carrying its reason. The tests
(`tests/matrix/`) and `benchmarks/matrix.py` (the table) both run cells through here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specc.errors import UsageError

MAX_SEQ_LEN = 96
MAX_NEW_TOKENS = 24
NUM_PROMPTS = 8
PROMPT_SEED = 11
BACKENDS = ("eager", "inductor", "aoti", "onnx")

# Tiny training and settings that make each method draft, accept and reject within seconds.
_TRAIN = ["train_seq_len=32", "eval_sequences=2", "learning_rate=1e-2"]
METHOD_SETTINGS: dict[str, list[str]] = {
    "none": [],
    "draft-model": ["num_draft_tokens=3", "tree_width=2"],
    "prompt-lookup": ["max_ngram=2", "tree_width=2"],
    "kangaroo": [*_TRAIN, "train_steps=20", "eval_every=20"],
    "firp": [*_TRAIN, "train_steps=10", "train_windows=8", "eval_every=10"],
    "s3d": [*_TRAIN, "train_steps=20", "eval_every=20", "select=false"],
    "swift": ["calib_prompts=0", "adapt=true", "context_window=8", "max_tries_per_prompt=8"],
    # Exits must happen for the cell to mean anything: a low threshold, every layer scheduled.
    "specee": ["train_steps=10", "train_windows=8", "predictor_windows=4", "eval_sequences=2", "predictor_epochs=2",
               "train_seq_len=32", "eval_every=10", "exit_threshold=0.001", "offline_layers=64"],
    "eagle": [*_TRAIN, "train_steps=20", "eval_every=20", "draft_vocab_size=48", "tree_width=2", "tree_nodes=8"],
}
METHODS = tuple(METHOD_SETTINGS)   # every registered lossless method, `none` first
# The methods whose drafter composes with the lookup branches (`CompositionOptions`).
COMPOSABLE = ("draft-model", "kangaroo", "eagle", "specee")
TRAINED = ("kangaroo", "firp", "s3d", "specee", "eagle")   # take calibration text the target samples
# Other settings of a method the matrix also runs (`Cell.variant`): method -> variant -> settings,
# applied over METHOD_SETTINGS.
VARIANTS: dict[str, dict[str, list[str]]] = {
    "draft-model": {"chain": ["num_draft_tokens=4", "tree_width=1"]},
    # One pseudo step: a drafted token and both nodes' pseudo rows fit bfloat16's 4 exact rows.
    "firp": {"k1": ["steps=1", "tree=chain"]},
}


@dataclass(frozen=True)
class Cell:
    method: str
    family: str
    backend: str
    dtype: str = "float32"
    quantize: str | None = None   # weight-only quantization (`specc compile --quantize`)
    quantize_draft: str | None = None   # the draft graphs' own (`--quantize-draft`); the reference ignores it
    lookup: bool = False          # with the n-gram branch in the method's tree (`--set lookup=true`)
    variant: str = ""             # other settings of the method (VARIANTS), or its METHOD_SETTINGS

    @property
    def label(self) -> str:
        method = f"{self.method}:{self.variant}" if self.variant else self.method
        method = f"{method}+lookup" if self.lookup else method
        return (f"{method}-{self.family}-{self.backend}-{self.dtype}" + (f"-{self.quantize}" if self.quantize else "")
                + (f"-{self.quantize_draft}-draft" if self.quantize_draft else ""))


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    status: str                  # identical | differs | lossy | refused | error
    detail: str = ""             # first difference, refusal reason or error
    seconds: float = 0.0
    drafted: int = 0             # draft tokens the engine proposed over all prompts
    accepted: int = 0            # of which the target accepted
    forward_passes: int = 0      # target forward passes over all prompts (the prefills included)
    new_tokens: int = 0          # tokens generated over all prompts

    @property
    def passed(self) -> bool:
        return self.status in ("identical", "lossy", "refused")

    def mark(self) -> str:
        return {"identical": f"✓ ({self.accepted}/{self.drafted} accepted)", "differs": f"✗ {self.detail}",
                "lossy": f"compiled lossy: {self.detail}", "refused": f"refused: {self.detail}",
                "error": f"error: {self.detail}"}[self.status]

    def short_mark(self) -> str:
        """`mark()` up to the first ';' (a refusal's reason without its advice), for tables."""
        return self.mark().split(";")[0]


class QuirkyCheckpoints:
    """family -> (target, draft, calibration text): quirky tiny checkpoints built once under `root`.
    The target's EOS is a token greedy decoding emits mid-way, so prompts end both ways; the
    draft is a noisy copy (accepted sometimes, rejected sometimes)."""

    def __init__(self, root: Path):
        self.root = root
        self._built: dict[str, tuple[Path, Path, Path]] = {}

    def __call__(self, family: str) -> tuple[Path, Path, Path]:
        if family not in self._built:
            from specc.testing.checkpoints import (build_quirky_checkpoint, build_tiny_checkpoint, sample_calibration_text,
                                       set_eos_to_a_generated_token, varied_prompts)

            home = self.root / family
            target = build_quirky_checkpoint(family, home / "target")
            set_eos_to_a_generated_token(target, varied_prompts(12, 96, seed=7), MAX_NEW_TOKENS)
            draft = build_tiny_checkpoint(family, home / "draft", noise_from=target, noise=0.08)
            calib = sample_calibration_text(target, home / "calib.txt", sequences=16, temperature=0.5)
            self._built[family] = (target, draft, calib)
        return self._built[family]


def prompts() -> list[list[int]]:
    from specc.testing.checkpoints import varied_prompts

    return varied_prompts(NUM_PROMPTS, 96, seed=PROMPT_SEED)


def compile_cell(cell: Cell, checkpoints: QuirkyCheckpoints, output: Path):
    """The cell's engine, loaded (raises `UsageError` when the cell is refused)."""
    from specc.compiler import CompileRequest, compile_engine
    from specc.engine.loaded import load_engine

    target, draft, calib = checkpoints(cell.family)
    settings = list(METHOD_SETTINGS[cell.method]) + (VARIANTS[cell.method][cell.variant] if cell.variant else [])
    if cell.method == "draft-model":
        settings.append(f"draft_model={draft}")
    if cell.method in TRAINED:
        settings.append(f"calib_data={calib}")
    if cell.method == "prompt-lookup":   # a random model's own context rarely repeats; text it wrote does
        settings.append(f"lookup_corpus={calib}")
    if cell.lookup:
        settings += ["lookup=true", "lookup_max_ngram=2"]
    compile_engine(CompileRequest(model=str(target), method=cell.method, output=output, backend=cell.backend,
                                  dtype=cell.dtype, max_seq_len=MAX_SEQ_LEN, force=True, settings=settings,
                                  quantize=cell.quantize, quantize_draft=cell.quantize_draft))
    return load_engine(output)


def decode(engine) -> list:
    """The engine's greedy generation (`GenerationResult`) for every matrix prompt."""
    return [engine.generate_ids(ids, MAX_NEW_TOKENS) for ids in prompts()]


def reference(cell: Cell, checkpoints: QuirkyCheckpoints, workdir: Path, cache: dict) -> list[list[int]]:
    """What the cell must reproduce: HF greedy in float32, the `none` engine of the cell's
    backend, dtype and quantization otherwise (memoised in `cache`)."""
    key = (cell.family, cell.backend, cell.dtype, cell.quantize) if cell.dtype != "float32" else (cell.family,)
    if key not in cache:
        if cell.dtype == "float32":
            from specc.testing.checkpoints import hf_greedy

            cache[key] = hf_greedy(checkpoints(cell.family)[0], prompts(), MAX_NEW_TOKENS)
        else:
            none = Cell("none", cell.family, cell.backend, cell.dtype, cell.quantize)
            engine = compile_cell(none, checkpoints, workdir / f"{none.label}-reference")
            cache[key] = [result.token_ids for result in decode(engine)]
    return cache[key]


def first_difference(got: list[list[int]], want: list[list[int]]) -> str:
    """'prompt p, token t' of the first differing token, or '' when identical."""
    for p, (a, b) in enumerate(zip(got, want)):
        if a != b:
            t = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"prompt {p}, token {t}"
    return ""


def cell_engine(cell: Cell, checkpoints: QuirkyCheckpoints, workdir: Path, engines: dict | None = None):
    """The cell's loaded engine (raises `UsageError` when refused); compiled once when
    `engines` keeps them, so later checks on the same cell reuse it."""
    if engines is not None and cell in engines:
        return engines[cell]
    engine = compile_cell(cell, checkpoints, workdir / cell.label)
    if engines is not None:
        engines[cell] = engine
    return engine


def run_cell(cell: Cell, checkpoints: QuirkyCheckpoints, workdir: Path, cache: dict,
             engines: dict | None = None) -> CellResult:
    """Compile, decode and compare one cell; a refusal or a crash is a result, not an exception.
    `engines`, when given, keeps the loaded engine by cell (see `cell_engine`)."""
    start = time.perf_counter()

    def result(status: str, detail: str = "", drafted: int = 0, accepted: int = 0, passes: int = 0,
               new: int = 0) -> CellResult:
        return CellResult(cell, status, detail, time.perf_counter() - start, drafted, accepted, passes, new)

    try:
        want = reference(cell, checkpoints, workdir, cache)
        engine = cell_engine(cell, checkpoints, workdir, engines)
    except UsageError as refusal:
        return result("refused", str(refusal))
    except Exception as error:   # a late crash is a failed cell, reported with its type
        return result("error", f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
    generated = decode(engine)
    difference = first_difference([g.token_ids for g in generated], want)
    drafted = sum(g.stats.drafted_tokens for g in generated)
    accepted = sum(g.stats.accepted_tokens for g in generated)
    passes = sum(g.stats.target_forward_passes for g in generated)
    new = sum(g.stats.new_tokens for g in generated)
    if not engine.manifest["lossless"]:   # the compiler said so (and why) at compile time
        difference = f"differs at {difference}" if difference else "identical anyway"
        return result("lossy", difference, drafted, accepted, passes, new)
    return result("differs" if difference else "identical", difference, drafted, accepted, passes, new)
