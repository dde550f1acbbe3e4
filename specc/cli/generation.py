"""`specc run` and `specc chat`: prompts in, text streamed out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specc.errors import UsageError
from specc.runtime.method_report import method_report


def read_prompts(prompts: list[str], prompt_files: list[Path], stdin=None) -> list[str]:
    """--prompt TEXT (repeatable; '-' is stdin) then --prompt-file FILE (repeatable), in that order."""
    stdin = stdin or sys.stdin
    texts = []
    for prompt in prompts:
        texts.append(stdin.read() if prompt == "-" else prompt)
    for path in prompt_files:
        if str(path) == "-":
            texts.append(stdin.read())
            continue
        if not path.is_file():
            raise UsageError(f"--prompt-file {path} does not exist" if not path.exists()
                             else f"--prompt-file {path} is not a file")
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"--prompt-file {path} is not UTF-8 text") from None
    if not texts:
        raise UsageError("no prompt; pass --prompt TEXT, --prompt - (stdin) or --prompt-file FILE")
    for index, text in enumerate(texts):
        if not text:
            where = f"prompt {index + 1}" if len(texts) > 1 else "the prompt"
            raise UsageError(f"{where} is empty; pass some text with --prompt")
    return texts


def unescape_stop(text: str) -> str:
    """--stop '\\n' means a newline (shells do not turn \\n into one inside quotes)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _stops(args) -> list[str]:
    return [unescape_stop(s) for s in args.stop]


def _sampling(args):
    from specc.contract.sampling import SamplingConfig

    return SamplingConfig(temperature=args.temperature, top_p=args.top_p, seed=args.seed)


def run(args) -> int:
    from specc.engine.loaded import load_engine
    from specc.runtime.generate import check_lengths
    from specc.runtime.textgen import generate_text

    sampling = _sampling(args)
    prompts = read_prompts(args.prompt, args.prompt_file)
    engine = load_engine(args.engine, args.backend, args.device, args.settings)
    encoded = []
    for text in prompts:    # every prompt is checked before the first one runs
        if args.chat:
            from specc.data.chat import chat_prompt_ids

            ids = chat_prompt_ids(engine.tokenizer, text)
        else:
            ids = engine.encode(text)
        check_lengths(len(ids), args.max_new_tokens, engine.max_seq_len)
        encoded.append(ids)
    stream = not (args.no_stream or args.json)
    for index, (text, ids) in enumerate(zip(prompts, encoded)):
        if index and not args.json:
            print()
        if stream and not args.chat:
            _write(text)
        on_text = _write if stream else None
        result = generate_text(engine, ids, args.max_new_tokens, sampling, _stops(args), on_text=on_text)
        if args.json:
            stats = result.stats.to_json()
            stats["compile_seconds"] = round(engine.compile_seconds, 3)
            report = method_report(engine.runtime)
            if report:
                stats["method"] = report
            print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                              "finish_reason": result.finish_reason, "stats": stats}), flush=True)
            continue
        if stream:
            _write("\n")
        else:
            print(result.text if args.chat else text + result.text, flush=True)
        _print_stats(result.stats)
    return 0


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _print_stats(s) -> None:
    rate = "n/a" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
    print(f"[{s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, mean accepted length "
          f"{s.mean_accepted_length:.2f}, acceptance {rate}]", file=sys.stderr, flush=True)


def chat(args, stdin=None) -> int:
    """The REPL: each line is a user turn; the whole conversation is re-encoded through the chat
    template every turn, and only what the previous turn did not leave in the KV cache is
    prefilled (`specc.runtime.prefix_reuse`). Oldest turns are dropped when the conversation
    outgrows the engine."""
    from specc.data.chat import conversation_ids, has_chat_template
    from specc.engine.loaded import load_engine
    from specc.runtime.textgen import generate_text

    stdin = stdin or sys.stdin
    sampling = _sampling(args)
    engine = load_engine(args.engine, args.backend, args.device, args.settings)
    if not has_chat_template(engine.tokenizer):
        raise UsageError(f"the tokenizer of {args.engine} has no chat template, so it cannot chat; "
                         f"use `specc run {args.engine} --prompt TEXT` for plain continuation")
    interactive = stdin.isatty()
    system = [{"role": "system", "content": args.system}] if args.system else []
    smallest_turn = conversation_ids(engine.tokenizer, system + [{"role": "user", "content": "?"}])
    budget = reply_budget(args.max_new_tokens, engine.max_seq_len, len(smallest_turn))
    history: list[dict] = []
    refused = 0
    if interactive:
        print(f"chatting with {args.engine} ({engine.method.name}); /reset starts over, /exit or Ctrl-D leaves",
              file=sys.stderr)
    while True:
        try:
            line = input("> ") if interactive else stdin.readline()
        except EOFError:
            line = ""
        except KeyboardInterrupt:   # Ctrl-C at the prompt leaves, like Ctrl-D
            print(file=sys.stderr)
            return 0
        if not interactive and line == "":
            return 1 if refused else 0
        message = line.rstrip("\n")
        if message.strip() in ("/exit", "/quit"):
            return 0
        if message.strip() == "/reset":
            history = []
            print("(new conversation)", file=sys.stderr)
            continue
        if not message.strip():
            continue
        turn = history + [{"role": "user", "content": message}]
        ids = conversation_ids(engine.tokenizer, system + turn)
        while len(ids) + budget > engine.max_seq_len and len(turn) > 1:
            turn = turn[2:]          # drop the oldest user/assistant exchange
            ids = conversation_ids(engine.tokenizer, system + turn)
        if len(ids) + budget > engine.max_seq_len:
            print(f"specc: this message ({len(ids)} tokens with the template) + {budget} reply tokens exceeds "
                  f"the engine's max sequence length {engine.max_seq_len}: at most "
                  f"{engine.max_seq_len - budget} message tokens fit; send a shorter one", file=sys.stderr)
            refused += 1
            continue
        stream = not args.no_stream
        try:
            result = generate_text(engine, ids, budget, sampling, _stops(args),
                                   on_text=_write if stream else None, reuse_prefix=not args.no_prefix_reuse)
        except KeyboardInterrupt:
            print("\n(reply stopped)", file=sys.stderr)
            continue
        print(result.text.strip("\n") if not stream else "", flush=True)
        history = turn + [{"role": "assistant", "content": result.text}]


CHAT_REPLY_TOKENS = 256   # `specc chat`'s reply budget when the engine has room for it


def reply_budget(requested: int | None, max_seq_len: int, smallest_turn: int) -> int:
    """Tokens per chat reply: `requested` (--max-new-tokens), or CHAT_REPLY_TOKENS cut to half
    the room a one-character message leaves (`smallest_turn` tokens with the template), so
    that messages fit too. Raises `UsageError` when no message could get a reply."""
    room = max_seq_len - smallest_turn
    if room < 1:
        raise UsageError(f"the engine's max sequence length {max_seq_len} leaves no room to chat: the chat template "
                         f"around a one-character message already takes {smallest_turn} tokens; recompile with a "
                         f"larger --max-seq-len")
    if requested is None:
        return max(1, min(CHAT_REPLY_TOKENS, room // 2))
    if requested < 1:
        raise UsageError(f"--max-new-tokens {requested} must be at least 1")
    if requested > room:
        raise UsageError(f"--max-new-tokens {requested} leaves no room for a message in the engine's max sequence "
                         f"length {max_seq_len} (the template around a one-character message takes "
                         f"{smallest_turn} tokens): pass at most {room}, or leave it out to fit the engine")
    return requested
