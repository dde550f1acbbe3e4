"""The OpenAI-compatible HTTP API over one loaded engine (FastAPI).

    GET  /health                 {"status": "ok", "running", "queued", "served", "aborted"}
    GET  /v1/models              the engine, as one model
    POST /v1/completions         prompt: text, [text] or [token ids]
    POST /v1/chat/completions    messages through the model's chat template

Both POSTs take max_tokens (completions default 16 as OpenAI's; chat: up
to the engine's context, at most 1024), temperature (default 1, as
OpenAI's; 0 decodes greedily), top_p, seed, stop (a string or up to 4),
stream (server-sent events ending with ``data: [DONE]``) and n (only 1).
Unsupported features (echo, logprobs, n > 1, tools) and malformed values
get 400 with an OpenAI-style error body; a full queue gets 503. Responses
carry the usual usage counts (``prompt_tokens_details.cached_tokens``: the
prompt tokens whose KV the previous request left, which were not prefilled;
see `specc.runtime.prefix_reuse`) and, as an extension, ``specc`` statistics
(mean accepted length, acceptance rate, tokens/s).
"""

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from specc.errors import SpeccError
from specc.serve.worker import Cancelled, QueueFull, Worker

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_MAX_TOKENS_CAP = 1024
MAX_STOP_STRINGS = 4


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Params:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    stream: bool


def _error(status: int, message: str, kind: str, param: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}},
                        status_code=status)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{name} must be a number, got {json.dumps(value)}", name)
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise BadRequest(f"{name} must be in {bound}, got {value}", name)
    return float(value)


def _integer(body: dict, name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {json.dumps(value)}", name)
    if value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}, got {value}", name)
    return value


def parse_params(body: dict, max_tokens_names: tuple[str, ...]) -> Params:
    if body.get("n") not in (None, 1):
        raise BadRequest("only n=1 is supported (one completion per request)", "n")
    if body.get("echo"):
        raise BadRequest("echo is not supported", "echo")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise BadRequest("logprobs are not supported", "logprobs")
    if body.get("tools") or body.get("functions"):
        raise BadRequest("tools and function calling are not supported", "tools")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("only best_of=1 is supported", "best_of")
    max_tokens = None
    for name in max_tokens_names:
        value = _integer(body, name, 1)
        if value is not None:
            max_tokens = value
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise BadRequest(f"stop must be a string or a list of strings, got {json.dumps(stop)}", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be true or false, got {json.dumps(stream)}", "stream")
    return Params(max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                  top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), seed=_integer(body, "seed", 0),
                  stop=stops, stream=stream)


def _message_text(message, index: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise BadRequest(f"messages[{index}] must be an object with role and content", "messages")
    role, content = message.get("role"), message.get("content")
    if role not in ("system", "developer", "user", "assistant"):
        raise BadRequest(f"messages[{index}].role must be system, user or assistant, got {json.dumps(role)}",
                         "messages")
    if isinstance(content, list):   # content parts: only text is understood
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise BadRequest(f"messages[{index}].content parts must be text parts", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise BadRequest(f"messages[{index}].content must be a string", "messages")
    return ("system" if role == "developer" else role), content


class SpeccServer:
    def __init__(self, engine, model_name: str, max_queue: int = 16, reuse_prefix: bool = True):
        self.engine = engine
        self.model_name = model_name
        self.reuse_prefix = reuse_prefix
        self.worker = Worker(max_queue)
        self.created = int(time.time())

    # --- request parsing -----------------------------------------------------

    def completion_prompt(self, body: dict) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("prompt is empty", "prompt")
            return self.engine.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.engine.architecture(_target_graph(self.engine)).vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise BadRequest(f"prompt token ids must be in [0, {vocab})", "prompt")
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) > 1:
            raise BadRequest("one prompt per request: batch prompts are not supported", "prompt")
        raise BadRequest("prompt must be a non-empty string or a list of token ids", "prompt")

    def chat_prompt(self, body: dict) -> list[int]:
        from specc.data.chat import conversation_ids, has_chat_template

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", "messages")
        conversation = [dict(zip(("role", "content"), _message_text(m, i))) for i, m in enumerate(messages)]
        if not has_chat_template(self.engine.tokenizer):
            raise BadRequest(f"model {self.model_name!r} has no chat template; use /v1/completions", "messages")
        try:
            return conversation_ids(self.engine.tokenizer, conversation)
        except SpeccError as exc:
            raise BadRequest(str(exc), "messages") from None

    def budget(self, prompt_ids: list[int], requested: int | None, default: int | None) -> int:
        """New tokens for the request: `requested` (the client's max_tokens) when it fits, else
        `default` (None: up to the context, at most CHAT_MAX_TOKENS_CAP) cut to what fits."""
        context, length = self.engine.max_seq_len, len(prompt_ids)
        room = context - length
        if requested is not None and requested > room:
            fits = f"at most {room} new tokens fit" if room > 0 else "the prompt alone fills it"
            raise BadRequest(f"the prompt ({length} tokens) + max_tokens {requested} exceeds the model's context "
                             f"length {context}: {fits}", "max_tokens")
        if requested is None and room < 1:
            raise BadRequest(f"the prompt ({length} tokens) leaves no room for a reply in the model's context "
                             f"length {context} (up to {context - 1} prompt tokens fit); shorten it", "max_tokens")
        if requested is not None:
            return requested
        return min(default if default is not None else CHAT_MAX_TOKENS_CAP, room)

    # --- generation ----------------------------------------------------------

    def submit(self, prompt_ids: list[int], max_tokens: int, params: Params, on_text=None):
        from specc.contract.sampling import SamplingConfig
        from specc.runtime.textgen import generate_text

        sampling = SamplingConfig(temperature=params.temperature, top_p=params.top_p, seed=params.seed)

        def work(job):
            return generate_text(self.engine, prompt_ids, max_tokens, sampling, params.stop, on_text=on_text,
                                 should_abort=job.cancelled.is_set, reuse_prefix=self.reuse_prefix)

        return self.worker.submit(work)

    def usage(self, prompt_ids: list[int], result) -> dict:
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": len(result.token_ids),
                "total_tokens": len(prompt_ids) + len(result.token_ids),
                "prompt_tokens_details": {"cached_tokens": result.stats.reused_prompt_tokens}}

    @staticmethod
    def specc_stats(result) -> dict:
        s = result.stats
        return {"mean_accepted_length": round(s.mean_accepted_length, 4),
                "acceptance_rate": None if s.acceptance_rate is None else round(s.acceptance_rate, 4),
                "tokens_per_second": round(s.tokens_per_second, 3)}


def _target_graph(engine) -> str:
    graphs = engine.manifest["graphs"]
    return "target" if "target" in graphs else next(iter(graphs))


def create_app(engine, model_name: str, max_queue: int = 16, on_startup=None, reuse_prefix: bool = True):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    server = SpeccServer(engine, model_name, max_queue, reuse_prefix)
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if on_startup is not None:
            on_startup()
        yield
        server.worker.stop()

    app = FastAPI(title="specc", lifespan=lifespan)
    app.state.server = server

    @app.get("/health")
    async def health():
        worker = server.worker
        return {"status": "ok", "model": model_name, "running": worker.running, "queued": worker.queue.qsize(),
                "served": worker.served, "aborted": worker.aborted}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        if model_id != model_name:
            return _error(404, f"model {model_id!r} does not exist; this server serves {model_name!r}",
                          "invalid_request_error", "model")
        return _model_card(server)

    async def handle(request: Request, chat: bool):
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_request_error")
        try:
            params = parse_params(body, ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",))
            prompt_ids = server.chat_prompt(body) if chat else server.completion_prompt(body)
            max_tokens = server.budget(prompt_ids, params.max_tokens,
                                       None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
        except BadRequest as exc:
            return _error(400, str(exc), "invalid_request_error", exc.param)
        except SpeccError as exc:
            return _error(400, str(exc), "invalid_request_error")
        ids = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if params.stream:
            return await _stream(server, request, prompt_ids, max_tokens, params, chat, ids)
        try:
            job = server.submit(prompt_ids, max_tokens, params)
        except QueueFull:
            return _busy(server)
        try:
            result = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancelled.set()
            raise
        except SpeccError as exc:
            return _error(400, str(exc), "invalid_request_error")
        except Exception as exc:
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": result.finish_reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        return JSONResponse({"id": ids, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model_name, "choices": [choice],
                             "usage": server.usage(prompt_ids, result), "specc": server.specc_stats(result)})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    async def _stream(server, request, prompt_ids, max_tokens, params, chat, ids):
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def post(kind, value):
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, value))
            except RuntimeError:     # the event loop is gone (server shutting down)
                pass

        try:
            job = server.submit(prompt_ids, max_tokens, params, on_text=lambda piece: post("text", piece))
        except QueueFull:
            return _busy(server)
        job.future.add_done_callback(lambda future: post("done", future))
        created = int(time.time())
        kind_name = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece: str | None, finish: str | None = None, extra: dict | None = None) -> str:
            if chat:
                delta = {} if piece is None else {"content": piece}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
            data = {"id": ids, "object": kind_name, "created": created, "model": model_name, "choices": [choice],
                    **(extra or {})}
            return f"data: {json.dumps(data)}\n\n"

        async def events_out():
            try:
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}
                    opening = {"id": ids, "object": kind_name, "created": created, "model": model_name,
                               "choices": [first]}
                    yield f"data: {json.dumps(opening)}\n\n"
                while True:
                    kind, value = await events.get()
                    if kind == "text":
                        yield chunk(value)
                        continue
                    try:
                        result = value.result()
                    except Cancelled:
                        return
                    except Exception as exc:
                        error = {"message": f"generation failed: {type(exc).__name__}: {exc}",
                                 "type": "server_error", "param": None, "code": None}
                        yield f"data: {json.dumps({'error': error})}\n\n"
                        return
                    yield chunk(None, result.finish_reason,
                                {"usage": server.usage(prompt_ids, result), "specc": server.specc_stats(result)})
                    yield "data: [DONE]\n\n"
                    return
            finally:
                job.cancelled.set()    # a client that went away stops the generation after its round

        return StreamingResponse(events_out(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


def _model_card(server: SpeccServer) -> dict:
    return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "specc",
            "specc_method": server.engine.method.name}


def _busy(server: SpeccServer):
    return _error(503, f"the server is busy: {server.worker.queue.maxsize} requests are already waiting; "
                       f"retry later", "server_error")
