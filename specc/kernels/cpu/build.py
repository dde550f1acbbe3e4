"""Compile the C++ kernels of this folder once per machine and load them.

specc's CPU library (`NATIVE`) holds every kernel of this folder and, in
`torch_ops.cpp`, their registration as the CPU implementations of
`torch.ops.specc.*`; loading it registers them (`torch.ops.load_library`), and its
plain C entry points stay reachable through ctypes (the portable path, for tests).
A library is built with the host's C++ compiler (`CXX`, else `g++`, else `c++`)
for the host's CPU (`-march=native`: the kernels pick AVX-512 VNNI when the CPU has
it, else AVX2 with FMA and F16C), with OpenMP, against the installed torch's headers and libraries, into
`<specc cache>/kernels/<name>-<key>.so`; the key hashes the sources, the compiler's
version, the flags (with `tuning_flags`' choices for the CPU), torch's version and the CPU's model and flags, so another CPU,
torch or a changed source builds its own. The library links the OpenMP runtime
torch has already loaded (same soname), so its parallel loops share torch's threads.
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
from specc.host.cpuinfo import cpuinfo_text, first_processor

SOURCES = Path(__file__).resolve().parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
NATIVE = "specc_cpu"
LIBRARIES = {NATIVE: ("blocked_matmul.cpp", "row_attention.cpp", "decoder_chain.cpp", "row_argmax.cpp", "call_trace.cpp",
                     "torch_ops.cpp")}   # else <name>.cpp alone


class KernelBuildError(SpeccError):
    """A CPU kernel could not be compiled or loaded."""


def compiler() -> str | None:
    """The C++ compiler to build with: `CXX`, else `g++`, else `c++` on the PATH; None if none."""
    for candidate in (os.environ.get("CXX"), "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _cpu_identity() -> str:
    cpuinfo = cpuinfo_text()
    if cpuinfo is None:
        return platform.processor() or platform.machine()
    wanted = [line for line in cpuinfo.splitlines() if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted) or platform.machine()


def tuning_flags(cpuinfo: str) -> tuple[str, ...]:
    """Defines that tune the kernels to the CPU `cpuinfo` (/proc/cpuinfo's text) describes. AMD's Zen 4
    (family 25 with AVX-512; Zen 3, the same family, has none) streams 4- and 8-bit tiles faster
    without blocked_matmul's per-block memory requests, and 6-bit tiles slower; Intel's Xeons stream
    twice as fast with those requests into L2, 4 KiB ahead, as with AMD's non-temporal ones 6 KiB
    ahead (benchmarks/NOTES.md)."""
    fields = first_processor(cpuinfo)
    zen4 = (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
            and "avx512f" in fields.get("flags", "").split())
    if zen4:
        return (f"-DSPECC_BLOCK_REQUESTS={1 << 6}",)
    if fields.get("vendor_id") == "GenuineIntel":
        return ("-DSPECC_PREFETCH_HINT=_MM_HINT_T1", "-DSPECC_PREFETCH_BYTES=4096")
    return ()


def _flags() -> tuple[str, ...]:
    return (*FLAGS, *tuning_flags(cpuinfo_text() or ""))


def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def sources(name: str) -> list[Path]:
    return [SOURCES / file for file in LIBRARIES.get(name, (f"{name}.cpp",))]


def _torch_flags() -> list[str]:
    """Compile against the installed torch: its headers, its ABI, its libraries (found at run time)."""
    import torch
    from torch.utils.cpp_extension import include_paths

    libraries = str(Path(torch.__file__).resolve().parent / "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [*(f"-I{path}" for path in include_paths()), f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-L{libraries}", f"-Wl,-rpath,{libraries}", "-lc10", "-ltorch_cpu"]


def library_path(name: str, cxx: str) -> Path:
    import torch

    digest = hashlib.sha256()
    headers = sorted(SOURCES.glob("*.h"))   # what the sources include
    for part in (*(file.read_bytes() for file in [*sources(name), *headers]), _compiler_version(cxx).encode(),
                 " ".join(_flags()).encode(), torch.__version__.encode(), _cpu_identity().encode()):
        digest.update(part)
    return cache_root() / "kernels" / f"{name}-{digest.hexdigest()[:16]}.so"


def _build(name: str, cxx: str, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    files = sources(name)
    with tempfile.TemporaryDirectory(dir=destination.parent) as staging:
        built = Path(staging) / destination.name
        result = subprocess.run([cxx, *_flags(), "-o", str(built), *map(str, files), *_torch_flags()],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise KernelBuildError(f"compiling specc's CPU kernel {' '.join(f.name for f in files)} with {cxx} "
                                   f"failed:\n{result.stderr.strip()[-2000:]}")
        os.replace(built, destination)


@cache
def load_library(name: str) -> ctypes.CDLL:
    """The compiled library `name` (`LIBRARIES`, else `<name>.cpp` here), built first if this machine
    has no build, loaded (registering the torch operators it implements) and opened with ctypes,
    its symbols global."""
    import torch  # its OpenMP runtime is loaded first, so the kernel shares it

    cxx = compiler()
    if cxx is None:
        raise KernelBuildError(f"specc's CPU kernel {name} is compiled on first use and needs a C++ compiler "
                               f"with OpenMP: none found (install g++, or set CXX)")
    path = library_path(name, cxx)
    if not path.exists():
        _build(name, cxx, path)
    try:
        torch.ops.load_library(str(path))
        # Global: AOTInductor packages call the library's C shims by name (specc/lower/c_shims.py).
        return ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
    except OSError as error:
        raise KernelBuildError(f"loading the compiled kernel {path} failed: {error}") from error
