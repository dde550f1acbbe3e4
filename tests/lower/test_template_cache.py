"""`templates_parsed_once`: Inductor parses each kernel template text once while a package
is built, renders it as before, and parses afresh outside the block."""

import torch._inductor.select_algorithm  # noqa: F401  (imported first, as Inductor does, to avoid a circular import)
from torch._inductor.codegen.common import KernelTemplate
from torch._inductor.codegen.cpp_gemm_template import CppGemmTemplate

from specc.lower.template_cache import templates_parsed_once

TEXT = "void {{ name }}() { return {{ value | indent_except_first(1) }}; }"


def test_a_text_is_parsed_once_inside_the_block_and_renders_with_any_options():
    with templates_parsed_once():
        first = KernelTemplate._template_from_string(TEXT)
        assert CppGemmTemplate._template_from_string(TEXT) is first   # the C++ GEMM template reaches it as a subclass
        assert first.render(name="a", value="1") == "void a() { return 1; }"
        assert first.render(name="b", value="x\ny") == "void b() { return x\n    y; }"


def test_the_block_restores_inductors_own_parsing():
    original = KernelTemplate.__dict__["_template_from_string"]
    with templates_parsed_once():
        assert KernelTemplate.__dict__["_template_from_string"] is not original
    assert KernelTemplate.__dict__["_template_from_string"] is original
    assert KernelTemplate._template_from_string(TEXT) is not KernelTemplate._template_from_string(TEXT)


def test_the_block_restores_parsing_when_the_build_fails():
    original = KernelTemplate.__dict__["_template_from_string"]
    try:
        with templates_parsed_once():
            raise RuntimeError("packaging failed")
    except RuntimeError:
        pass
    assert KernelTemplate.__dict__["_template_from_string"] is original
