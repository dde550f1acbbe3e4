"""One parse of a GGUF file per conversion.

transformers reads a GGUF file once for its tokenizer, once for its config and
once for its weights, each time through a new `gguf.GGUFReader`, and builds
gguf's tensor-name map once per submodule of the model (hundreds of times for
a 30-layer llama). The reader decodes every metadata string (a 49k-token vocabulary
and its merges) one memory-mapped slice at a time, so those repeats, not the
dequantization, were most of a conversion (see `benchmarks/NOTES.md`,
"Converting a GGUF"). Within `shared_gguf_reads()` both are built once and
shared: a reader is only ever read from, and so is a name map.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def shared_gguf_reads():
    """While active, `gguf.GGUFReader(path)` (read mode) returns one reader per file and
    `gguf.get_tensor_name_map(arch, n_blocks)` one map per architecture and depth, for every
    caller that looks them up on the `gguf` module at call time, as transformers does."""
    try:
        import gguf
    except ImportError:   # the reads that need it say so themselves
        yield
        return
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[Path, object] = {}

    def shared_reader(path, mode="r"):
        if mode != "r":
            return reader_class(path, mode)
        key = Path(path).resolve()
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
