"""llama.cpp as a baseline system: what a CPU user decodes a GGUF with today.

`specc bench ENGINE --baseline llama.cpp` runs the engine's source GGUF (the
file the engine's checkpoint was converted from, or `--gguf FILE`) in
llama.cpp through `llama-cpp-python` (the optional `peers` extra), from the
same prompt token ids, greedily, with the benchmark's thread count, as two
systems interleaved with the others: plain decoding and llama.cpp's own
prompt-lookup decoding (`LlamaPromptLookupDecoding`, 10 tokens, as
`specc bench`'s Hugging Face prompt lookup). llama.cpp computes in the
file's quantized formats, so its tokens are compared with the engine's as
agreement, not identity.
"""

from __future__ import annotations

import json
from pathlib import Path

from specc.bench.baselines import PROMPT_LOOKUP_TOKENS as LOOKUP_TOKENS
from specc.bench.systems import System
from specc.capture.gguf import MARKER_FILE
from specc.errors import UsageError

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_LOOKUP = "llama.cpp-prompt-lookup"
PEERS = (LLAMA_CPP, LLAMA_CPP_LOOKUP)    # systems that are other engines, not specc's or Hugging Face's
BASELINE_NAMES = ("llama.cpp",)          # what --baseline accepts
PEERS_EXTRA = "pip install 'specc[peers]'"


def llama_cpp_systems(gguf: Path, threads: int, max_new_tokens: int, context: int) -> list[System]:
    """llama.cpp plain and with its prompt lookup, on `gguf`, `threads` threads, `context` tokens."""
    llama_cpp = import_llama_cpp()
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    options = dict(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                   n_batch=min(512, context), verbose=False)
    plain = llama_cpp.Llama(**options)
    lookup = llama_cpp.Llama(**options, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS))
    config = {"gguf": str(gguf), "threads": threads, "llama_cpp_python": getattr(llama_cpp, "__version__", None)}
    return [_system(LLAMA_CPP, "llama.cpp (llama-cpp-python), greedy", plain, max_new_tokens, gguf, config),
            _system(LLAMA_CPP_LOOKUP, f"llama.cpp prompt lookup ({LOOKUP_TOKENS})", lookup, max_new_tokens, gguf,
                    {**config, "prompt_lookup_tokens": LOOKUP_TOKENS})]


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise UsageError(f"--baseline llama.cpp needs llama-cpp-python: {PEERS_EXTRA} (it builds llama.cpp from "
                         f"source; docs/cli.md gives the build flags for this machine)") from None
    return llama_cpp


def _system(name: str, label: str, llm, max_new_tokens: int, gguf: Path, config: dict) -> System:
    eos = llm.token_eos()

    def generate(prompt_ids: list[int]):
        llm.reset()
        tokens: list[int] = []
        for token in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            tokens.append(int(token))
            if token == eos or len(tokens) == max_new_tokens:
                break
        return tokens, None

    return System(name, label, "baseline", generate, gguf.stat().st_size, config)


def source_gguf(manifest: dict, given: Path | None) -> Path:
    """`given` (--gguf), else the GGUF the engine's checkpoint was converted from."""
    if given is not None:
        if not given.is_file():
            raise UsageError(f"--gguf {given} does not exist")
        return given
    checkpoint = Path(manifest["source_checkpoint"])
    try:
        marker = json.loads((checkpoint / MARKER_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(f"the engine was compiled from {checkpoint}, not from a GGUF file, so llama.cpp has "
                         f"nothing to run: pass the GGUF of the same model with --gguf FILE") from None
    for candidate in _candidates(marker):
        if candidate.is_file():
            return candidate
    raise UsageError(f"the engine's checkpoint was converted from {marker.get('source')}, which is no longer where "
                     f"it was; pass it with --gguf FILE")


def _candidates(marker: dict) -> list[Path]:
    """Where the conversion's source may be: the path it recorded, else the fetched downloads."""
    from specc.data.files import cache_root

    found = [Path(marker["source_path"])] if marker.get("source_path") else []
    if marker.get("source"):
        found += sorted((cache_root() / "downloads").glob(f"*/{marker['source']}"))
    return found
