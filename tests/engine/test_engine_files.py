"""Engine files get the user's umask (safetensors alone writes 0600), and stale staging is cleaned."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from specc.engine.save import remove_stale_staging
from specc.testing.checkpoints import build_tiny_checkpoint


@pytest.mark.parametrize("umask,file_mode", [(0o022, 0o644), (0o077, 0o600)])
def test_engine_files_follow_the_umask(tmp_path, umask, file_mode):
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model")
    code = ("import os, sys; os.umask(int(sys.argv[1], 8)); from specc.cli.main import main; "
            "sys.exit(main(sys.argv[2:]))")
    result = subprocess.run([sys.executable, "-c", code, oct(umask), "compile", str(checkpoint), "--method", "none",
                             "-o", str(tmp_path / "engine"), "--max-seq-len", "32"],
                            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    engine = tmp_path / "engine"
    assert stat.S_IMODE((engine / "weights" / "target.safetensors").stat().st_mode) == file_mode
    assert stat.S_IMODE((engine / "manifest.json").stat().st_mode) == file_mode
    assert stat.S_IMODE(engine.stat().st_mode) == 0o777 & ~umask


def test_remove_stale_staging_keeps_live_processes(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name in (f".e.partial-{dead.pid}", f".e.old-{dead.pid}", f".e.partial-{os.getpid()}",
                 f".e.partial-{os.getppid()}", ".other.partial-1"):
        (tmp_path / name).mkdir()
    removed = remove_stale_staging(tmp_path / "e")
    assert sorted(p.name for p in removed) == sorted([f".e.partial-{dead.pid}", f".e.old-{dead.pid}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".e.partial-{os.getpid()}", f".e.partial-{os.getppid()}", ".other.partial-1"])
