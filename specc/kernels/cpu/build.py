"""Compile a C++ kernel of this folder once per machine and load it with ctypes.

The library is built with the host's C++ compiler (`CXX`, else `g++`, else `c++`)
for the host's CPU (`-march=native`: the kernels pick AVX-512 VNNI when the CPU has
it), with OpenMP, into `<specc cache>/kernels/<name>-<key>.so`; the key hashes the
source, the compiler's version, the flags and the CPU's model and flags, so another
CPU or a changed source builds its own. The library links the OpenMP runtime torch
has already loaded (same soname), so its parallel loops share torch's threads.
A build is written under a temporary name and renamed into place: a crash leaves
nothing half-written, and concurrent builds agree.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from specc.data.files import cache_root
from specc.errors import SpeccError

SOURCES = Path(__file__).resolve().parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")


class KernelBuildError(SpeccError):
    """A CPU kernel could not be compiled or loaded."""


def compiler() -> str | None:
    """The C++ compiler to build with: `CXX`, else `g++`, else `c++` on the PATH; None if none."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted) or platform.machine()


def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def library_path(name: str, cxx: str) -> Path:
    source = SOURCES / f"{name}.cpp"
    digest = hashlib.sha256()
    for part in (source.read_bytes(), _compiler_version(cxx).encode(), " ".join(FLAGS).encode(),
                 _cpu_identity().encode()):
        digest.update(part)
    return cache_root() / "kernels" / f"{name}-{digest.hexdigest()[:16]}.so"


def _build(name: str, cxx: str, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent) as staging:
        built = Path(staging) / destination.name
        result = subprocess.run([cxx, *FLAGS, "-o", str(built), str(SOURCES / f"{name}.cpp")],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise KernelBuildError(f"compiling specc's CPU kernel {name}.cpp with {cxx} failed:\n"
                                   f"{result.stderr.strip()[-2000:]}")
        os.replace(built, destination)


@cache
def load_library(name: str) -> ctypes.CDLL:
    """The compiled kernel `name` (`<name>.cpp` here), built first if this machine has no build."""
    import torch  # noqa: F401  (its OpenMP runtime is loaded first, so the kernel shares it)

    cxx = compiler()
    if cxx is None:
        raise KernelBuildError(f"specc's CPU kernel {name} is compiled on first use and needs a C++ compiler "
                               f"with OpenMP: none found (install g++, or set CXX)")
    path = library_path(name, cxx)
    if not path.exists():
        _build(name, cxx, path)
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelBuildError(f"loading the compiled kernel {path} failed: {error}") from error
