"""What the benchmark ran on: machine, library versions, a short device label."""

from __future__ import annotations

import os
import platform
import re

import torch

from specc.host.cpuinfo import cpu_model
from specc.host.threads import chosen_threads

# Where the benchmark runs HF models and engines: specc engines run on CPU today.
DEVICE_USED = "cpu"


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_model() or platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": chosen_threads()[0],
        "torch_threads_reason": chosen_threads()[1],
        "memory_bytes": _total_memory_bytes(),
        "python": platform.python_version(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device_used": DEVICE_USED,
    }
    return info


def versions() -> dict:
    import transformers

    import specc

    return {"specc": getattr(specc, "__version__", None) or _package_version("specc"),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def device_label(device: str = "cpu") -> str:
    """A file-name-safe label of the device the benchmark ran on: the GPU's
    name for a CUDA run, else e.g. `cpu-x86_64-2core` (engines run on CPU today)."""
    if device.startswith("cuda"):
        return _slug(torch.cuda.get_device_name(torch.device(device)))
    return _slug(f"cpu-{platform.machine()}-{os.cpu_count()}core")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
