"""Through `specc serve`, every method samples the same text for the same seed whether or not
the request reused the cache an earlier request left: a greedy request, then the conversation
extended and sampled with a seed, gives what `specc run` gives for that prompt and seed."""

from __future__ import annotations

import json
import urllib.request
from contextlib import redirect_stdout
from io import StringIO

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from specc.cli.main import main  # noqa: E402
from specc.testing.exactness_matrix import METHODS, Cell, QuirkyCheckpoints, compile_cell  # noqa: E402
from tests.serve.servers import running_server  # noqa: E402

PROMPT = "w5 w6 w7 w8 w9"
NEW = 12
SEED = 7


def _complete(server: str, body: dict) -> dict:
    request = urllib.request.Request(f"{server}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _run(engine, prompt: str, *extra: str) -> str:
    out = StringIO()
    with redirect_stdout(out):
        assert main(["run", str(engine), "--prompt", prompt, "--max-new-tokens", str(NEW), "--json", *extra]) == 0
    return json.loads(out.getvalue())["text"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, prompt_lookup_method):
    return QuirkyCheckpoints(tmp_path_factory.mktemp("quirky-serve"))


@pytest.mark.parametrize("method", METHODS)
def test_a_seeded_request_after_a_reused_prefix_samples_what_specc_run_does(checkpoints, tmp_path, method):
    engine = tmp_path / "engine"
    compile_cell(Cell(method, "llama", "eager"), checkpoints, engine)
    with running_server(engine) as server:
        first = _complete(server, {"prompt": PROMPT, "max_tokens": NEW, "temperature": 0})
        turn = PROMPT + first["choices"][0]["text"] + " w5 w6"
        sampled = _complete(server, {"prompt": turn, "max_tokens": NEW, "temperature": 0.8, "seed": SEED})
    assert sampled["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "the second request reused the cache"
    assert sampled["choices"][0]["text"] == _run(engine, turn, "--temperature", "0.8", "--seed", str(SEED))
