"""A real `specc serve` subprocess over an engine, for the serve tests: `with running_server(engine, *serve_args) as url`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(engine, *extra: str):
    """The server's base URL once /health answers; the process ends with the block."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specc.cli.main", "serve", str(engine), "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited: {process.stderr.read()}")
        try:
            if get_json(f"{url}/health")["status"] == "ok":
                break
        except (OSError, ValueError):
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail("server did not come up")
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
