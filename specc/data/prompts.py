"""Prompt sets for `specc bench`, all available without a network.

Named sets:
  code        held-out code prefixes (`specc.data.corpora.heldout_prompts`,
              or a stdlib sampler until that module exists)
  text        held-out prose prefixes (needs `specc.data.corpora`)
  code-train  code prefixes from the training split, shuffled: prompts for
  text-train  `specc distill-data` that share no document with `code`/`text`
  spec_bench  Spec-Bench questions, grouped by their `category` field
  gsm8k       GSM8K test questions
Anything else is a file: JSONL with "prompt", "text" or "turns" (the first
turn is used) and an optional "category", or plain text with one prompt
per blank-line-separated block.

Prompts taken from "turns" (Spec-Bench style) are conversational: `Prompt.chat`
is set, and the benchmark formats them with the model's chat template when
its tokenizer has one.

Sets with several categories are ordered round-robin across categories, so
`--num-prompts N` (the first N) covers every category.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import chain, zip_longest
from pathlib import Path

from specc.errors import UsageError
from specc.data.shared import SHARED_DATA_ENV, shared_data_dir  # noqa: F401  (re-exported)

DEFAULT_GENERATED_PROMPTS = 16
CODE_PROMPT_CHARS = 512
TEXT_PROMPT_CHARS = 512
_SHARED_FILES = {"spec_bench": ("spec_bench", "question.jsonl"), "gsm8k": ("gsm8k", "test.jsonl")}
_TEXT_FIELDS = ("prompt", "text", "turns")
_TRAIN_SPLIT_SETS = {"code-train": "code", "text-train": "text"}
PROMPT_SET_NAMES = ("code", "text", *_TRAIN_SPLIT_SETS, *_SHARED_FILES)   # everything else must be a file


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    chat: bool = False               # a conversational turn: chat-format it when the tokenizer can


@dataclass
class PromptSet:
    name: str
    prompts: list[Prompt]
    source: str                      # where the prompts came from, for the report
    notes: list[str] = field(default_factory=list)

    @property
    def categories(self) -> list[str]:
        return list(dict.fromkeys(p.category for p in self.prompts))


def load_prompt_set(spec: str, limit: int | None = None) -> PromptSet:
    """The prompt set named `spec` (or read from the file `spec`), first `limit` prompts."""
    if limit is not None and limit < 1:
        raise UsageError(f"--num-prompts {limit} must be at least 1")
    if spec in ("code", "text"):
        prompt_set = _generated_set(spec, limit or DEFAULT_GENERATED_PROMPTS)
    elif spec in _TRAIN_SPLIT_SETS:
        prompt_set = _train_split_set(spec, limit or DEFAULT_GENERATED_PROMPTS)
    elif spec in _SHARED_FILES:
        prompt_set = _shared_set(spec)
    elif Path(spec).is_file():
        prompt_set = _file_set(Path(spec))
    else:
        raise UsageError(f"--prompts {spec!r} is neither a prompt set ({', '.join(PROMPT_SET_NAMES)}) "
                         f"nor an existing file")
    if not prompt_set.prompts:
        raise UsageError(f"prompt set {spec!r} ({prompt_set.source}) holds no prompts")
    prompt_set.prompts = interleave_categories(prompt_set.prompts)[:limit]
    return prompt_set


def interleave_categories(prompts: list[Prompt]) -> list[Prompt]:
    """Round-robin across categories (first-seen order), keeping order within each."""
    groups: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        groups.setdefault(prompt.category, []).append(prompt)
    return [p for p in chain.from_iterable(zip_longest(*groups.values())) if p is not None]


def _generated_set(kind: str, n: int) -> PromptSet:
    chars = CODE_PROMPT_CHARS if kind == "code" else TEXT_PROMPT_CHARS
    heldout = _heldout_prompts_function()
    if heldout is not None:
        texts = heldout(kind, n, chars)
        short = [f"the held-out {kind} split yields only {len(texts)} of the {n} prompts asked for"]
        return PromptSet(kind, [Prompt(t, kind) for t in texts],
                         f"specc.data.corpora.heldout_prompts({kind!r}, {n}, {chars})",
                         short if len(texts) < n else [])
    if kind == "text":
        raise UsageError("the 'text' prompt set needs specc.data.corpora, which is not installed; "
                         "use --prompts code, spec_bench, gsm8k or a file")
    from specc.data.stdlib_prompts import stdlib_code_prompts

    return PromptSet(kind, [Prompt(t, kind) for t in stdlib_code_prompts(n, chars)],
                     f"stdlib code prefixes ({n} x {chars} chars)",
                     ["code prompts come from the stdlib fallback sampler, not the reference models' "
                      "held-out split; a reference model may have trained on them"])


def _train_split_set(name: str, n: int) -> PromptSet:
    from specc.data.corpora import train_prompts

    kind = _TRAIN_SPLIT_SETS[name]
    chars = CODE_PROMPT_CHARS if kind == "code" else TEXT_PROMPT_CHARS
    texts = train_prompts(kind, n, chars)
    short = [f"the {kind} training split yields only {len(texts)} of the {n} prompts asked for"]
    return PromptSet(name, [Prompt(t, kind) for t in texts], f"specc.data.corpora.train_prompts({kind!r}, {n}, "
                     f"{chars})", short if len(texts) < n else [])


def _heldout_prompts_function():
    try:
        from specc.data.corpora import heldout_prompts
    except ImportError as exc:
        # Only the module's absence means "not written yet"; a broken module must surface.
        if exc.name in ("specc.refmodels", "specc.data.corpora") or "heldout_prompts" in str(exc):
            return None
        raise
    return heldout_prompts


def _shared_set(name: str) -> PromptSet:
    folder, file_name = _SHARED_FILES[name]
    path = shared_data_dir() / folder / file_name
    if not path.is_file():
        raise UsageError(f"prompt set {name!r} needs {path}, which does not exist; put the file there, "
                         f"point ${SHARED_DATA_ENV} at the folder holding {folder}/{file_name}, "
                         f"or use --prompts code")
    records = read_jsonl(path)
    if name == "gsm8k":
        prompts = [Prompt(_field(r, ("question",), path, i), "gsm8k") for i, r in enumerate(records)]
    else:
        prompts = [_prompt(r, ("turns",), path, i, "spec_bench") for i, r in enumerate(records)]
    return PromptSet(name, prompts, str(path))


def _file_set(path: Path) -> PromptSet:
    if path.suffix == ".jsonl":
        prompts = [_prompt(r, _TEXT_FIELDS, path, i, path.stem) for i, r in enumerate(read_jsonl(path))]
    else:
        blocks = path.read_text(encoding="utf-8").split("\n\n")
        prompts = [Prompt(b.strip("\n"), path.stem) for b in blocks if b.strip()]
    return PromptSet(path.stem, prompts, str(path))


def read_jsonl(path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number} is not valid JSON ({exc.msg}); write one JSON object per line") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{number} is a JSON {type(record).__name__}, not an object")
        records.append(record)
    return records


def _prompt(record: dict, names: tuple[str, ...], path: Path, index: int, default_category: str) -> Prompt:
    name, text = _named_field(record, names, path, index)
    return Prompt(text, str(record.get("category", default_category)), chat=name == "turns")


def _field(record: dict, names: tuple[str, ...], path: Path, index: int) -> str:
    return _named_field(record, names, path, index)[1]


def _named_field(record: dict, names: tuple[str, ...], path: Path, index: int) -> tuple[str, str]:
    for name in names:
        value = record.get(name)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, str) and value:
            return name, value
    raise UsageError(f"record {index + 1} of {path} has no non-empty {' / '.join(repr(n) for n in names)} field")
