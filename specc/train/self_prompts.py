"""User turns the target writes itself: `specc distill-data --prompts self-chat`.

A chat drafter learns from chat text, and the chat prompts at hand are few:
Spec-Bench's open-ended MT-bench part is 80 questions, and the ones a
benchmark uses must stay out of training. An instruction-tuned model given
its chat template up to the opening of a user turn writes a plausible user
request itself (Xu et al. 2024, "Magpie"): sampled at temperature 1 it gives
as many varied requests as asked, from the distribution it was tuned on,
with nothing but the checkpoint. `distill-data` then answers them greedily
like any other prompt set, so the training text is the target's own
conversation, both turns.
"""

from __future__ import annotations

import torch
from specc.console.progress import progress_bar

from specc.data.prompts import Prompt
from specc.errors import UsageError

SELF_CHAT = "self-chat"
SAMPLES_PER_PROMPT = 4   # give up after this many samples per prompt asked for (unfinished or repeated turns)
_SENTINEL = "\x00specc-user-turn\x00"


def self_chat_prompts(model, tokenizer, count: int, seed: int, batch_size: int,
                      max_tokens: int) -> list[Prompt]:
    """`count` distinct user requests sampled from the model after its template's user-turn
    opening, each ended by the template's own end of turn within `max_tokens` tokens.
    Deterministic for a given seed and batch size; the global RNG is left as it was."""
    opening, turn_end = user_turn_bounds(tokenizer)
    forbidden = set(tokenizer.all_special_ids) - {turn_end}
    prompts: list[Prompt] = []
    seen: set[str] = set()
    budget = SAMPLES_PER_PROMPT * count
    with torch.random.fork_rng(devices=_forked_devices(model)), \
            progress_bar(total=count, desc="distill-data: the target's user turns", unit="prompt") as bar:
        torch.manual_seed(seed)
        while len(prompts) < count and budget > 0:
            rows = min(batch_size, budget)
            budget -= rows
            for tokens in _sample_turns(model, opening, rows, turn_end, max_tokens):
                text = _finished_turn(tokenizer, tokens, turn_end, forbidden)
                if text is None or text in seen or len(prompts) == count:
                    continue
                seen.add(text)
                prompts.append(Prompt(text, SELF_CHAT, chat=True))
                bar.update(1)
    if len(prompts) < count:
        raise UsageError(f"the model finished only {len(prompts)} distinct user turns in "
                         f"{SAMPLES_PER_PROMPT * count} samples of up to {max_tokens} tokens, fewer than the "
                         f"{count} asked for; raise --max-query-tokens or ask for fewer prompts")
    return prompts


def user_turn_bounds(tokenizer) -> tuple[list[int], int]:
    """The token ids the chat template puts before a user message's text, and the
    token that ends the message (the first one the template puts after it)."""
    from specc.data.chat import has_chat_template

    if not has_chat_template(tokenizer):
        raise UsageError(f"--prompts {SELF_CHAT} needs a chat template to open a user turn, and the model's "
                         f"tokenizer has none; pass a prompt set or file instead")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                             add_generation_prompt=False)
    if _SENTINEL not in rendered:
        raise UsageError(f"--prompts {SELF_CHAT}: the chat template does not place the user's text verbatim, "
                         f"so the opening of a user turn cannot be found")
    before, after = rendered.split(_SENTINEL, 1)
    closing = tokenizer(after.strip(), add_special_tokens=False)["input_ids"] if after.strip() else []
    if not closing:
        raise UsageError(f"--prompts {SELF_CHAT}: the chat template puts nothing after a user message, "
                         f"so the end of a sampled user turn cannot be recognised")
    return tokenizer(before, add_special_tokens=False)["input_ids"], int(closing[0])


def _sample_turns(model, opening: list[int], rows: int, turn_end: int, max_tokens: int) -> list[list[int]]:
    input_ids = torch.tensor([opening] * rows, device=model.device)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
                             eos_token_id=[turn_end], pad_token_id=turn_end)
    return [row[len(opening):].tolist() for row in out]


def _finished_turn(tokenizer, tokens: list[int], turn_end: int, forbidden: set[int]) -> str | None:
    """The request's text if the sample ended its turn and holds no other special token, else None."""
    if turn_end not in tokens:
        return None
    body = tokens[:tokens.index(turn_end)]
    if any(t in forbidden for t in body):
        return None
    text = tokenizer.decode(body, skip_special_tokens=False).strip()
    return text or None


def _forked_devices(model) -> list:
    return [model.device] if model.device.type == "cuda" else []
