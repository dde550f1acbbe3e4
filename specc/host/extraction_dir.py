"""Where an AOTInductor package is unpacked while it is loaded: off a filesystem held in memory.

Loading an AOTInductor package extracts its shared library (a float engine's carries its
weights) into a fresh directory under the temporary directory (`TMPDIR`, else /tmp) and maps it
from there until the package is freed. Where that directory is a tmpfs, as many distributions
mount /tmp, the extracted files are memory that cannot be paged out, held beside the copy of the
weights the package makes for itself. So while a package loads, `TMPDIR` points at
`$SPECC_CACHE_DIR/extracted/<pid>` instead, where that is on disk; elsewhere nothing changes.
The loader removes what it extracted when the package is freed; what a killed process left
behind is removed by the next load, once no process of that id runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from specc.data.files import cache_root

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MOUNTS = Path("/proc/self/mounts")
TEMPORARY_ENV = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")   # std::filesystem::temp_directory_path's order
EXTRACTED = "extracted"


def temporary_directory() -> Path:
    """The directory a C++ library's temporary files go to: the first of `TEMPORARY_ENV` set, else /tmp."""
    return Path(next((os.environ[name] for name in TEMPORARY_ENV if os.environ.get(name)), "/tmp"))


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem `path` lies on (its deepest mount point), from /proc/self/mounts'
    text; None where that cannot be read."""
    if mounts is None:
        try:
            mounts = MOUNTS.read_text()
        except OSError:
            return None
    path = Path(os.path.realpath(path))
    found, depth = None, -1
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(_unescaped(fields[1]))
        if (path == point or point in path.parents) and len(point.parts) > depth:
            found, depth = fields[2], len(point.parts)
    return found


def in_memory(path: Path, mounts: str | None = None) -> bool:
    return filesystem_type(path, mounts) in MEMORY_FILESYSTEMS


@contextlib.contextmanager
def extraction_on_disk(disk: Path | None = None) -> Iterator[None]:
    """`TMPDIR` at `disk` (default `$SPECC_CACHE_DIR/extracted/<pid>`) for the body, where the
    temporary directory is in memory and `disk` is not; restored on exit."""
    if not in_memory(temporary_directory()):
        yield
        return
    if disk is None:
        remove_orphans(cache_root() / EXTRACTED)
        disk = cache_root() / EXTRACTED / str(os.getpid())
    try:
        disk.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield
        return
    if in_memory(disk):
        yield
        return
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(disk)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = previous


def remove_orphans(base: Path) -> None:
    """Remove each `base/<pid>` whose process no longer runs."""
    for child in base.iterdir() if base.is_dir() else ():
        if child.name.isdigit() and not _running(int(child.name)):
            shutil.rmtree(child, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # it runs, as another user
        return True
    return True


def _unescaped(field: str) -> str:
    """A mounts field with its octal escapes (`\\040` for a space) decoded."""
    return field.encode().decode("unicode_escape") if "\\" in field else field
