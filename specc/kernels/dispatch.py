"""Which implementation an op runs: the Triton kernel or the PyTorch reference.

- CUDA: the Triton kernel (triton must be installed).
- CPU: the Triton kernel run by Triton's interpreter when `TRITON_INTERPRET=1`
  is set and triton is installed (how the kernels are tested on machines
  without a GPU); otherwise the PyTorch reference. Without the interpreter
  Triton has no CPU driver at all ("0 active drivers").

`@triton.jit` reads `TRITON_INTERPRET` when it decorates a kernel, i.e. when
the kernel module is imported. The modules are imported here, on first use,
and refused if the variable changed since.

triton 3.6's interpreter (torch 2.11's triton) holds a scalar as a one-element
array and turns it into a loop bound with `int()`, which numpy 2.4 refuses, so
every kernel fails there; that combination is refused with its fix.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from types import ModuleType

from specc.errors import SpeccError

INTERPRET_ENV = "TRITON_INTERPRET"


def interpreting() -> bool:
    return os.environ.get(INTERPRET_ENV) == "1"


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def cpu_runs_triton() -> bool:
    """Whether CPU tensors go through the Triton interpreter (else the reference)."""
    if not interpreting():
        return False
    if not triton_installed():
        warnings.warn(f"{INTERPRET_ENV}=1 is set but triton is not installed; specc's kernels run their "
                      f"PyTorch reference on CPU (pip install 'specc[kernels]' to interpret the Triton kernels)",
                      stacklevel=3)
        return False
    return True


def _release(distribution: str) -> tuple[int, int]:
    major, minor = importlib.metadata.version(distribution).split(".")[:2]
    return int(major), int(minor)


def interpreter_incompatibility() -> str | None:
    """Why the installed triton's interpreter cannot run specc's kernels, or None."""
    if importlib.util.find_spec("numpy") is None:
        return "Triton's interpreter needs numpy: pip install 'specc[kernels]'"
    triton, numpy = _release("triton"), _release("numpy")
    if triton < (3, 7) and numpy >= (2, 4):
        return (f"triton {'.'.join(map(str, triton))}'s interpreter cannot run with numpy "
                f"{'.'.join(map(str, numpy))} (it converts one-element arrays to loop bounds, which numpy 2.4 "
                f"refuses): pip install 'numpy<2.4', or unset {INTERPRET_ENV} to run the PyTorch reference on CPU")
    return None


def triton_kernel_module(name: str) -> ModuleType:
    """`specc.kernels.<name>`, the module holding the Triton kernel and its launcher."""
    if not triton_installed():
        raise SpeccError(f"kernel {name!r} needs triton on this device: pip install 'specc[kernels]' "
                         f"(triton 3.6 or 3.7)")
    problem = interpreting() and interpreter_incompatibility()
    if problem:
        raise SpeccError(problem)
    module = importlib.import_module(f"specc.kernels.{name}")
    if module.INTERPRETED != interpreting():
        raise SpeccError(
            f"kernel {name!r} was imported with {INTERPRET_ENV} {'set' if module.INTERPRETED else 'unset'} and "
            f"is now called with it {'set' if interpreting() else 'unset'}; set {INTERPRET_ENV} before "
            f"Python starts and leave it alone")
    return module
