"""Kernel tests run the Triton kernels in Triton's interpreter, on CPU tensors.

`TRITON_INTERPRET=1` is set for the whole test session by `tests/conftest.py`
(Triton reads it when first imported, and other tests import Triton through
Inductor); the fixture below keeps it set for these tests in any case.
"""

from __future__ import annotations

import pytest

from specc.kernels.dispatch import INTERPRET_ENV, triton_installed, triton_kernel_module


@pytest.fixture(autouse=True)
def interpret_triton(monkeypatch):
    monkeypatch.setenv(INTERPRET_ENV, "1")


@pytest.fixture
def triton_kernels():
    """`name -> module` of an interpreted Triton kernel; skips the test when triton is absent."""
    if not triton_installed():
        pytest.skip("triton is not installed: pip install 'specc[kernels]' to run the kernels in its interpreter")
    return triton_kernel_module
