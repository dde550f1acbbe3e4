"""Training corpora for the reference models, split deterministically into train and held-out.

Two kinds of corpus:

* ``code``: the ``*.py`` sources of the running interpreter's standard library.
  A file is held out when the hash of its relative path falls in the held-out
  bucket, so the split never depends on how much of the corpus a spec uses.
* ``text``: English text from the shared data folder (``SPECC_SHARED_DATA`` or
  ``<repo>/../shared/data``). The tail of every source is held out. Missing
  sources are skipped with a logged warning.

Held-out documents feed the validation metrics and `heldout_prompts`, which
benchmarks use as prompts the models never trained on.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specc.errors import SpeccError, UsageError
from specc.data.shared import SHARED_DATA_ENV, shared_data_dir  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

CORPUS_KINDS = ("code", "text")
HELDOUT_PERCENT = 5

# Generated or machine-specific modules (codec tables, pydoc topic dumps, build
# variables) and test suites full of deliberately odd code; none of it is
# representative Python.
_EXCLUDED_STDLIB_DIRS = frozenset(
    {"site-packages", "test", "tests", "idle_test", "__pycache__", "encodings", "pydoc_data"}
)
_EXCLUDED_STDLIB_PREFIXES = ("_sysconfigdata",)

# (relative path or glob, whether it is tokenized PTB-style and needs detokenizing)
_TEXT_SOURCES = (
    ("tinyshakespeare/input.txt", False),
    ("gutenberg_nltk/*.txt", True),
    ("wikitext2_test/wiki.test.raw.txt", True),
)
_TEXT_SKIPPED_NAMES = frozenset({"SOURCE.txt"})


class CorpusUnavailableError(SpeccError):
    """No document of the requested corpus kind could be found."""


@dataclass(frozen=True)
class Document:
    source: str  # "stdlib:json/decoder.py", "text:gutenberg_nltk/austen-emma.txt"
    text: str


@dataclass(frozen=True)
class Corpus:
    kind: str
    train: tuple[Document, ...]
    heldout: tuple[Document, ...]

    def capped_train(self, max_bytes: int) -> tuple[Document, ...]:
        """The training documents, cut down to about ``max_bytes`` of text."""
        if self.kind == "code":
            return _whole_documents_up_to(self.train, max_bytes)
        return _proportional_prefixes(self.train, max_bytes)


@dataclass(frozen=True)
class CorpusSelection:
    """The documents one reference model is built from, grouped by corpus kind."""

    train: dict[str, tuple[Document, ...]]
    heldout: dict[str, tuple[Document, ...]]
    tokenizer_sample: tuple[Document, ...]

    def fingerprint(self) -> str:
        groups = [("tokenizer", self.tokenizer_sample)]
        for kind in sorted(self.train):
            groups += [(f"train:{kind}", self.train[kind]), (f"heldout:{kind}", self.heldout[kind])]
        return hashlib.sha256(
            "".join(f"{name}={corpus_fingerprint(docs)};" for name, docs in groups).encode()
        ).hexdigest()


def select_corpus(
    code_bytes: int, text_bytes: int, tokenizer_code_bytes: int, tokenizer_text_bytes: int
) -> CorpusSelection:
    """Training, held-out and tokenizer documents under the given byte caps.

    A kind with a zero cap, or with no documents on this machine, is left out.
    """
    caps = {"code": (code_bytes, tokenizer_code_bytes), "text": (text_bytes, tokenizer_text_bytes)}
    train, heldout, tokenizer_sample = {}, {}, []
    for kind, (train_cap, tokenizer_cap) in caps.items():
        corpus = load_corpus(kind)
        tokenizer_sample += corpus.capped_train(tokenizer_cap)
        chosen = corpus.capped_train(train_cap)
        if chosen:
            train[kind], heldout[kind] = chosen, corpus.heldout
    if not train:
        raise CorpusUnavailableError(
            f"no training documents: the standard library sources under {stdlib_dir()} and the "
            f"text under {shared_data_dir()} (set {SHARED_DATA_ENV}) are both missing or excluded"
        )
    return CorpusSelection(train, heldout, tuple(tokenizer_sample))


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(kind: str) -> Corpus:
    if kind == "code":
        return _load_code_corpus(stdlib_dir())
    if kind == "text":
        return _load_text_corpus(shared_data_dir())
    raise UsageError(f"unknown corpus kind {kind!r}; choose from: {', '.join(CORPUS_KINDS)}")


def corpus_fingerprint(documents: tuple[Document, ...] | list[Document]) -> str:
    digest = hashlib.sha256()
    for doc in documents:
        for part in (doc.source, doc.text):
            encoded = part.encode("utf-8")
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
    return digest.hexdigest()


def heldout_prompts(kind: str, n: int, prompt_chars: int) -> list[str]:
    """``n`` prompt prefixes of at most ``prompt_chars`` characters from held-out documents.

    Code prompts start at a ``def``/``class`` line and end before a line break;
    text prompts start at a line and end before a space, so a prompt never ends
    in whitespace. Prompts never overlap and are taken round-robin across
    documents, so consecutive prompts come from different sources. Fewer than
    ``n`` come back only if the held-out set runs out.
    """
    return _split_prompts(load_corpus(kind).heldout, kind, "held-out", n, prompt_chars)[:n]


def train_prompts(kind: str, n: int, prompt_chars: int, seed: int = 0) -> list[str]:
    """``n`` prompt prefixes cut as `heldout_prompts` cuts them, but from the training
    documents and in a seeded shuffle, so the first ``n`` spread over the whole split:
    prompts for training text (`specc distill-data`) that never share a document with
    the benchmark's."""
    prompts = _split_prompts(load_corpus(kind).train, kind, "training", n, prompt_chars)
    random.Random(seed).shuffle(prompts)
    return prompts[:n]


def _split_prompts(documents: tuple[Document, ...], kind: str, split: str, n: int, prompt_chars: int) -> list[str]:
    """Every prompt of one split's `documents` (`split` names it in errors), round-robin
    across documents."""
    if n < 0 or prompt_chars < 1:
        raise UsageError(f"{split} prompts need n >= 0 and prompt_chars >= 1")
    if not documents:
        raise CorpusUnavailableError(f"no {split} {kind} documents are available")
    return _round_robin([_document_prompts(doc.text, kind, prompt_chars) for doc in documents])


# --- code corpus -------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load_code_corpus(root: Path) -> Corpus:
    train, heldout = [], []
    for path in _stdlib_source_files(root):
        relative = path.relative_to(root).as_posix()
        text = _read_utf8(path)
        if not text or text.isspace():
            continue
        doc = Document(f"stdlib:{relative}", text)
        (heldout if _is_heldout_file(relative) else train).append(doc)
    # Hash order spreads a byte cap over the whole library instead of its
    # alphabetical beginning.
    train.sort(key=lambda doc: _stable_hash(doc.source))
    return Corpus("code", tuple(train), tuple(heldout))


def _stdlib_source_files(root: Path) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        relative_parts = path.relative_to(root).parts
        if any(part in _EXCLUDED_STDLIB_DIRS for part in relative_parts[:-1]):
            continue
        if path.name.startswith(_EXCLUDED_STDLIB_PREFIXES):
            continue
        files.append(path)
    return sorted(files)


def _is_heldout_file(relative_path: str) -> bool:
    return int(_stable_hash(relative_path), 16) % 100 < HELDOUT_PERCENT


def _read_utf8(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        log.debug("skipping %s: not UTF-8", path)
        return None


# --- text corpus -------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _load_text_corpus(data_dir: Path) -> Corpus:
    train, heldout = [], []
    for path, needs_detokenizing in _text_source_files(data_dir):
        text = path.read_text(encoding="utf-8")
        if needs_detokenizing:
            text = detokenize(text)
        source = f"text:{path.relative_to(data_dir).as_posix()}"
        cut = _line_boundary_near(text, len(text) * (100 - HELDOUT_PERCENT) // 100)
        train.append(Document(source, text[:cut]))
        heldout.append(Document(source, text[cut:]))
    return Corpus("text", tuple(train), tuple(heldout))


def _text_source_files(data_dir: Path) -> list[tuple[Path, bool]]:
    found = []
    for pattern, needs_detokenizing in _TEXT_SOURCES:
        matches = sorted(p for p in data_dir.glob(pattern) if p.name not in _TEXT_SKIPPED_NAMES)
        if not matches:
            log.info("text corpus: %s not found under %s; skipping it", pattern, data_dir)
        found.extend((path, needs_detokenizing) for path in matches)
    return found


_DETOKENIZE_RULES = (
    (re.compile(r" @([-.,])@ "), r"\1"),  # wikitext: "1 @,@ 000" -> "1,000"
    (re.compile(r"`` ?"), '"'),
    (re.compile(r" ?''"), '"'),
    (re.compile(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", re.IGNORECASE), r"\1"),
    (re.compile(r" ([.,;:!?%)\]}])"), r"\1"),
    (re.compile(r"([(\[{$]) "), r"\1"),
)


def detokenize(text: str) -> str:
    """Undo PTB-style tokenization ("Emma 's , handsome ." -> "Emma's, handsome.")."""
    for pattern, replacement in _DETOKENIZE_RULES:
        text = pattern.sub(replacement, text)
    return text


def _line_boundary_near(text: str, position: int) -> int:
    newline = text.find("\n", position)
    return len(text) if newline < 0 else newline + 1


# --- capping -----------------------------------------------------------------


def _whole_documents_up_to(documents: tuple[Document, ...], max_bytes: int) -> tuple[Document, ...]:
    chosen, total = [], 0
    for doc in documents:
        size = len(doc.text.encode("utf-8"))
        if total + size > max_bytes:
            continue  # a smaller document further on may still fit
        chosen.append(doc)
        total += size
    return tuple(chosen)


def _proportional_prefixes(documents: tuple[Document, ...], max_bytes: int) -> tuple[Document, ...]:
    """The same leading fraction of every document, so each source keeps its share."""
    total = sum(len(doc.text) for doc in documents)
    if total <= max_bytes:
        return documents
    if max_bytes <= 0:
        return ()
    fraction = max_bytes / total
    prefixes = []
    for doc in documents:
        cut = _line_boundary_near(doc.text, int(len(doc.text) * fraction))
        prefixes.append(Document(doc.source, doc.text[:cut]))
    return tuple(prefixes)


# --- prompts -----------------------------------------------------------------

_CODE_PROMPT_START = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]", re.MULTILINE)
_TEXT_PROMPT_START = re.compile(r"^[ \t]*(?=\S)", re.MULTILINE)


def _prompt_starts(text: str, kind: str) -> list[int]:
    if kind == "code":
        return [match.start() for match in _CODE_PROMPT_START.finditer(text)]
    return [match.end() for match in _TEXT_PROMPT_START.finditer(text)]


def _document_prompts(text: str, kind: str, prompt_chars: int) -> list[str]:
    prompts, next_free = [], 0
    for start in _prompt_starts(text, kind):
        if start < next_free or start + prompt_chars > len(text):
            continue
        prompt = _trim_prompt_end(text[start : start + prompt_chars], kind)
        if prompt:
            prompts.append(prompt)
            next_free = start + len(prompt)
    return prompts


def _trim_prompt_end(window: str, kind: str) -> str:
    # End where the tokenizer would start a new token anyway: before the line
    # break for code (the break merges with the next line's indentation), before
    # a space for text (the space belongs to the next word).
    cut = window.rfind("\n") if kind == "code" else max(window.rfind(" "), window.rfind("\n"))
    return window[:cut].rstrip() if cut > 0 else ""


def _round_robin(per_document: list[list[str]]) -> list[str]:
    interleaved = []
    for index in range(max((len(prompts) for prompts in per_document), default=0)):
        interleaved.extend(prompts[index] for prompts in per_document if index < len(prompts))
    return interleaved


def _stable_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()
