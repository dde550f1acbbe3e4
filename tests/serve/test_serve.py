"""`specc serve` end to end: a real server subprocess, driven by the official `openai` client."""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from specc.cli.main import main  # noqa: E402
from tests.serve.servers import get_json, running_server  # noqa: E402
from specc.testing.checkpoints import build_tiny_checkpoint, tiny_chat_tokenizer  # noqa: E402

MODEL = "tiny"


def _post(url: str, body: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class Stream:
    """A streaming completion read line by line over a raw connection, closed at will."""

    def __init__(self, server: str, body: dict):
        host, port = server.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=60)
        self.connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()
        assert self.response.status == 200

    def first_event(self) -> str:
        while True:
            line = self.response.readline().decode()
            if line.startswith("data:"):
                return line

    def rest(self) -> list[str]:
        return [line.strip() for line in self.response.read().decode().splitlines() if line.strip()]

    def close(self) -> None:
        self.connection.sock.close()
        self.connection.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("serve")
    checkpoint = build_tiny_checkpoint("llama", root / "model")
    weights = load_file(str(checkpoint / "model.safetensors"))
    weights["lm_head.weight"][2] = 0.0          # EOS (id 2) practically never wins: long generations
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    tiny_chat_tokenizer().save_pretrained(checkpoint)
    assert main(["compile", str(checkpoint), "--method", "none", "-o", str(root / "engine"),
                 "--max-seq-len", "1024"]) == 0
    return root / "engine"


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine, "--model-name", MODEL, "--max-queue", "1") as url:
        yield url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def _wait_idle(server: str) -> dict:
    for _ in range(200):
        health = get_json(f"{server}/health")
        if not health["running"] and health["queued"] == 0:
            return health
        time.sleep(0.05)
    pytest.fail(f"server still busy: {health}")


def _cli_text(engine, prompt: str, n: int, *extra) -> dict:
    from io import StringIO
    from contextlib import redirect_stdout

    out = StringIO()
    with redirect_stdout(out):
        assert main(["run", str(engine), "--prompt", prompt, "--max-new-tokens", str(n), "--json", *extra]) == 0
    return json.loads(out.getvalue())


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert get_json(f"{server}/health")["status"] == "ok"


def test_completion_matches_specc_run_and_streams_the_same_text(client, engine):
    expected = _cli_text(engine, "w5 w6 w7", 12)
    response = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=12, temperature=0)
    assert response.choices[0].text == expected["text"]
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 12 and response.usage.prompt_tokens == 3
    pieces = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=12,
                                                                   temperature=0, stream=True)]
    assert "".join(pieces) == expected["text"] and len([p for p in pieces if p]) > 1


def test_a_request_extending_the_last_one_reuses_its_cache_and_matches_specc_run(client, engine):
    first = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=6, temperature=0)
    prompt = "w5 w6 w7 w9 w5"
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert second.choices[0].text == _cli_text(engine, prompt, 6)["text"]


def test_stop_strings(client, engine):
    full = _cli_text(engine, "w5 w6 w7", 16)["text"]
    stop = " " + full.split()[3]
    response = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=16, temperature=0, stop=[stop])
    assert response.choices[0].text == full[: full.index(stop)] and response.choices[0].finish_reason == "stop"


def test_chat_completion_and_chat_streaming(client, engine):
    expected = _cli_text(engine, "w5 w6", 8, "--chat")["text"]
    messages = [{"role": "user", "content": "w5 w6"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert response.choices[0].message.content == expected and response.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("kwargs,param", [
    (dict(temperature=5), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(max_tokens=5000), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=2), "n"),
    (dict(prompt=""), "prompt"),
    (dict(prompt=["a", "b"]), "prompt"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(logprobs=2), "logprobs"),
])
def test_bad_requests_get_400(client, kwargs, param):
    arguments = {"model": MODEL, "prompt": "w5", "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**arguments)
    assert error.value.status_code == 400 and param in str(error.value)


def test_malformed_bodies_get_400(server):
    for body in ("{not json", "[1, 2]", json.dumps({"messages": "hi"})):
        status, answer = _post(f"{server}/v1/chat/completions", body)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer


def test_a_client_that_disconnects_mid_stream_stops_its_generation(client, server):
    before = _wait_idle(server)
    stream = Stream(server, {"prompt": "w5 w6", "max_tokens": 1000, "temperature": 0, "stream": True})
    assert stream.first_event()
    stream.close()
    after = _wait_idle(server)
    assert after["aborted"] == before["aborted"] + 1 and after["served"] == before["served"], (before, after)
    # The server goes on serving.
    assert client.completions.create(model=MODEL, prompt="w5", max_tokens=3, temperature=0).choices[0].text


def test_a_full_queue_gets_503_and_requests_run_in_order(client, server):
    _wait_idle(server)
    finished = []
    running = Stream(server, {"prompt": "w5 w6", "max_tokens": 1000, "temperature": 0, "stream": True})
    assert running.first_event()      # running now

    def queued():
        finished.append(client.completions.create(model=MODEL, prompt="w7", max_tokens=2, temperature=0))

    waiting = threading.Thread(target=queued)
    waiting.start()
    for _ in range(200):                 # until the second request is waiting in the queue
        if get_json(f"{server}/health")["queued"] == 1:
            break
        time.sleep(0.005)
    with pytest.raises(openai.InternalServerError) as error:
        client.completions.create(model=MODEL, prompt="w8", max_tokens=2, temperature=0)
    assert error.value.status_code == 503 and "busy" in str(error.value)
    assert running.rest()[-1] == "data: [DONE]"
    running.close()
    waiting.join(timeout=60)
    assert finished and finished[0].choices[0].text


@pytest.mark.parametrize("length,requested,default,message", [
    (1476, None, None, "the prompt (1476 tokens) leaves no room for a reply in the model's context length 256"),
    (256, None, 16, "the prompt (256 tokens) leaves no room for a reply in the model's context length 256"),
    (250, 10, 16, "the prompt (250 tokens) + max_tokens 10 exceeds the model's context length 256: at most 6 new"),
    (300, 10, None, "max_tokens 10 exceeds the model's context length 256: the prompt alone fills it"),
])
def test_a_request_that_does_not_fit_is_refused_naming_only_what_the_client_sent(length, requested, default,
                                                                                  message):
    from types import SimpleNamespace

    from specc.serve.app import BadRequest, SpeccServer

    server = SpeccServer.__new__(SpeccServer)
    server.engine = SimpleNamespace(max_seq_len=256)
    with pytest.raises(BadRequest, match=re.escape(message)) as refused:
        server.budget([1] * length, requested, default)
    assert refused.value.param == "max_tokens" and not re.search(r"-\d", str(refused.value))


def test_a_request_without_max_tokens_gets_what_fits():
    from types import SimpleNamespace

    from specc.serve.app import CHAT_MAX_TOKENS_CAP, SpeccServer

    server = SpeccServer.__new__(SpeccServer)
    server.engine = SimpleNamespace(max_seq_len=4096)
    assert server.budget([1] * 4000, None, None) == 96
    assert server.budget([1] * 10, None, None) == CHAT_MAX_TOKENS_CAP
    assert server.budget([1] * 4090, None, 16) == 6
    assert server.budget([1] * 10, 7, 16) == 7
