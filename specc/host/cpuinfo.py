"""What Linux says of the CPU (/proc/cpuinfo), read once: its text, the first processor's fields, its flags.

On a system without the file every reader gets None or nothing, and callers fall back to
what `platform` and `os` say.
"""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@cache
def cpuinfo_text() -> str | None:
    """/proc/cpuinfo's text, or None on a system without it."""
    try:
        return CPUINFO.read_text()
    except OSError:
        return None


def first_processor(text: str) -> dict[str, str]:
    """The fields of the first processor `text` (/proc/cpuinfo's layout) describes; every processor repeats them."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_fields() -> dict[str, str]:
    """This CPU's fields (`model name`, `flags`, `vendor_id`, ...); empty where Linux does not say."""
    text = cpuinfo_text()
    return first_processor(text) if text is not None else {}


def cpu_model() -> str | None:
    """The CPU's model name, or None."""
    return cpu_fields().get("model name") or None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (`avx512f`, `avx512_bf16`, ...); empty where Linux does not say."""
    return frozenset(cpu_fields().get("flags", "").split())


def has_bfloat16_units() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16, AMX): without these units
    oneDNN emulates bfloat16 matmuls, slower than float32 ones."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def emulates_bfloat16() -> bool:
    """Whether this is an x86 CPU without bfloat16 units, where PyTorch's bfloat16 matmuls are
    emulated; False where Linux does not say (and on other architectures, whose flags differ)."""
    return platform.machine() in ("x86_64", "AMD64") and bool(cpu_flags()) and not has_bfloat16_units()


def physical_core_ids(text: str) -> set[tuple[str | None, str]]:
    """(physical id, core id) of every processor `text` lists: hyper-threads of one core share a pair."""
    seen = set()
    physical_id = core_id = None
    for line in text.splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical_id = value.strip()
        elif key == "core id":
            core_id = value.strip()
        elif not key and core_id is not None:
            seen.add((physical_id, core_id))
            physical_id = core_id = None
    return seen
