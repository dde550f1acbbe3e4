"""Inductor's kernel templates parsed once per source text while a package is built.

Inductor renders its C++ GEMM template for every linear it considers (twice: when
lowering and when generating code), and each render parses the same few Jinja
template texts afresh (`KernelTemplate._template_from_string`). Parsing, not
rendering, was the larger share: over a bfloat16 SmolLM2 package, thousands of
parses of a handful of texts. A parsed Jinja template renders any number of times
with any options, so reusing it changes no generated line; it only saves the
parsing (measurements: docs/backends.md#measurements-behind-the-lowering-choices).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator


@contextlib.contextmanager
def templates_parsed_once() -> Iterator[None]:
    """Within the block, a template text Inductor has parsed once is not parsed again.
    A torch without the hook (it is private) runs as before."""
    try:
        from torch._inductor.codegen.common import KernelTemplate
    except ImportError:
        yield
        return
    original = KernelTemplate.__dict__.get("_template_from_string")
    if not isinstance(original, staticmethod):
        yield
        return
    KernelTemplate._template_from_string = staticmethod(functools.lru_cache(maxsize=None)(original.__func__))
    try:
        yield
    finally:
        KernelTemplate._template_from_string = original
