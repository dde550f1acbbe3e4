"""SIGINT / SIGTERM at several points of a real `specc compile` subprocess: one line,
exit 130 / 143, and nothing left beside the output (no `.NAME.partial-PID`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specc.testing.checkpoints import build_tiny_checkpoint

# The child runs `specc compile`, with one function patched to announce "READY" and
# then sleep, so the test knows the compile is at that point when it sends the signal.
CHILD = textwrap.dedent("""
    import sys, time
    import specc.compiler as compiler
    point = sys.argv[1]

    def pause():
        print("READY", flush=True)
        time.sleep(60)

    if point == "capture":
        original = compiler.build_program
        def build_program(*args, **kwargs):
            pause()
            return original(*args, **kwargs)
        compiler.build_program = build_program
    elif point == "writing":
        original = compiler.write_program
        def write_program(staging, *args, **kwargs):
            tables = original(staging, *args, **kwargs)
            pause()
            return tables
        compiler.write_program = write_program
    elif point == "finalizer":
        # A signal arriving while the garbage collector runs a __del__ must still stop the compile.
        original = compiler.build_program
        class Finalized:
            def __del__(self):
                print("READY", flush=True)
                time.sleep(3)
        def build_program(*args, **kwargs):
            Finalized()
            time.sleep(30)
            return original(*args, **kwargs)
        compiler.build_program = build_program
    from specc.cli.main import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint("llama", tmp_path_factory.mktemp("interrupts") / "model")


def _compile_and_signal(checkpoint, output, point, signum):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, point, "compile", str(checkpoint), "--method", "none", "-o", str(output),
         "--max-seq-len", "32"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline().strip() == "READY"
        time.sleep(0.2)
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    return child.returncode, err


@pytest.mark.parametrize("point,signum,code,line", [
    ("writing", signal.SIGTERM, 143, "specc: terminated"),
    ("writing", signal.SIGINT, 130, "specc: interrupted"),
    ("capture", signal.SIGTERM, 143, "specc: terminated"),
    ("finalizer", signal.SIGINT, 130, "specc: interrupted"),
])
def test_a_signal_stops_the_compile_and_leaves_nothing(checkpoint, tmp_path, point, signum, code, line):
    output = tmp_path / "engine"
    returncode, err = _compile_and_signal(checkpoint, output, point, signum)
    assert returncode == code, err
    assert err.splitlines()[-1] == line and [l for l in err.splitlines() if l.startswith("specc:")] == [line], err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no engine, no staging directory"


def test_stale_staging_of_a_dead_process_is_removed_by_the_next_compile(checkpoint, tmp_path):
    from specc.cli.main import main

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".engine.partial-{dead.pid}"
    (stale / "weights").mkdir(parents=True)
    alive = tmp_path / f".engine.partial-{os.getppid()}"    # a live process's staging is left alone
    alive.mkdir()
    assert main(["compile", str(checkpoint), "--method", "none", "-o", str(tmp_path / "engine"),
                 "--max-seq-len", "32"]) == 0
    assert not stale.exists() and alive.exists() and (tmp_path / "engine" / "manifest.json").is_file()
