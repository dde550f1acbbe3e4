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


@pytest.fixture
def row_independent_dot(monkeypatch):
    """The interpreter's `tl.dot` computed one row of `a` at a time.

    The interpreter runs `tl.dot` as one numpy matmul, and numpy's BLAS may sum a row
    differently by where the row sits in the block: OpenBLAS's AVX2 kernels do (seen on a
    CPU it runs them on), its AVX-512 ones did not. A GPU's matrix instructions compute
    each output element alike wherever its row is. Row by row, each row's sums run the
    same way wherever it sits, so a bitwise row-invariance test checks the kernel's own
    reduction order (tiles, splits, masks), not the BLAS of the machine it runs on."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        rows = [original(self, _rows(a, i), b, _rows(d, i), input_precision, max_num_imprecise_acc)
                for i in range(a.data.shape[-2])]
        return interpreter.TensorHandle(np.concatenate([row.data for row in rows], axis=-2), rows[0].dtype)

    def _rows(handle, i):
        return interpreter.TensorHandle(handle.data[..., i:i + 1, :], handle.dtype)

    monkeypatch.setattr(builder, "create_dot", create_dot)
