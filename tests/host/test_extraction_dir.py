"""specc.host.extraction_dir: an AOTInductor package is unpacked on disk where the temporary
directory is a filesystem held in memory, and only there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specc.host import extraction_dir


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A fake mount table: / on ext4, `ram` a tmpfs, `spaced dir` (escaped as Linux writes it) a ramfs."""
    root = Path(os.path.realpath(tmp_path))
    for name in ("ram", "disk", "spaced dir"):
        (root / name).mkdir()
    mounts = root / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {root / 'ram'} tmpfs rw 0 0\n"
                      f"none {str(root / 'spaced dir').replace(' ', chr(92) + '040')} ramfs rw 0 0\n")
    monkeypatch.setattr(extraction_dir, "MOUNTS", mounts)
    for name in extraction_dir.TEMPORARY_ENV:
        monkeypatch.delenv(name, raising=False)
    return root


def test_a_path_lies_on_its_deepest_mount_point(machine):
    assert extraction_dir.filesystem_type(machine / "ram" / "x") == "tmpfs"
    assert extraction_dir.filesystem_type(machine / "disk") == "ext4"
    assert extraction_dir.filesystem_type(machine / "spaced dir") == "ramfs"
    assert extraction_dir.in_memory(machine / "ram") and not extraction_dir.in_memory(machine / "disk")
    assert extraction_dir.filesystem_type(machine, mounts="") is None


def test_the_temporary_directory_is_the_first_variable_set_else_tmp(monkeypatch):
    for name in extraction_dir.TEMPORARY_ENV:
        monkeypatch.delenv(name, raising=False)
    assert extraction_dir.temporary_directory() == Path("/tmp")
    monkeypatch.setenv("TEMP", "/b")
    monkeypatch.setenv("TMP", "/a")
    assert extraction_dir.temporary_directory() == Path("/a")


def test_a_temporary_directory_in_memory_is_replaced_by_the_disk_while_loading(machine, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(machine / "ram"))
    with extraction_dir.extraction_on_disk(machine / "disk" / "extracted"):
        assert os.environ["TMPDIR"] == str(machine / "disk" / "extracted")
        assert (machine / "disk" / "extracted").is_dir()
    assert os.environ["TMPDIR"] == str(machine / "ram")


def test_a_temporary_directory_on_disk_or_a_disk_in_memory_is_left_alone(machine, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(machine / "disk"))
    with extraction_dir.extraction_on_disk(machine / "disk" / "extracted"):
        assert os.environ["TMPDIR"] == str(machine / "disk")
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setenv("TMP", str(machine / "ram"))
    with extraction_dir.extraction_on_disk(machine / "spaced dir" / "extracted"):
        assert "TMPDIR" not in os.environ
    assert "TMPDIR" not in os.environ


def test_what_a_dead_process_left_is_removed_and_a_live_ones_kept(machine, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(machine / "ram"))
    monkeypatch.setenv("SPECC_CACHE_DIR", str(machine / "disk"))
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    base = machine / "disk" / extraction_dir.EXTRACTED
    dead, alive = base / done.stdout.strip(), base / str(os.getppid())
    for left in (dead, alive):
        (left / "aotinductor_x").mkdir(parents=True)
    with extraction_dir.extraction_on_disk():
        assert os.environ["TMPDIR"] == str(base / str(os.getpid()))
    assert not dead.exists() and alive.exists()
