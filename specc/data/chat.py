"""Chat-formatted prompts: one user message through the tokenizer's chat template.

Instruction-tuned models expect their conversation format (for SmolLM2:
``<|im_start|>user ... <|im_end|><|im_start|>assistant``); raw text makes
them continue the text instead of answering it. `specc run --chat` and
`specc bench` (for Spec-Bench-style conversational prompts) use this.
"""

from __future__ import annotations

from specc.errors import UsageError


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt_ids(tokenizer, message: str) -> list[int]:
    """Token ids of ``message`` as a single user turn, ending with the assistant's turn opening
    (``apply_chat_template(..., add_generation_prompt=True)``)."""
    if not message:
        raise UsageError("the prompt is empty; pass some text with --prompt")
    if not has_chat_template(tokenizer):
        raise UsageError("the model's tokenizer has no chat template, so the prompt cannot be chat-formatted; "
                         "drop --chat (or use a checkpoint whose tokenizer carries a chat template)")
    try:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True, return_dict=True
        )
    except Exception as exc:   # jinja2 raises its own types for a template that refuses the conversation
        raise UsageError(f"the tokenizer's chat template failed on a single user message: "
                         f"{type(exc).__name__}: {exc}") from None
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def conversation_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a whole conversation (``[{"role": ..., "content": ...}, ...]``) through the
    chat template, ending with the assistant's turn opening: `specc chat` re-encodes the
    conversation every turn, `specc serve` encodes each chat request."""
    if not has_chat_template(tokenizer):
        raise UsageError("the model's tokenizer has no chat template, so a conversation cannot be formatted; "
                         "use a checkpoint whose tokenizer carries a chat template (or `specc run` for raw text)")
    try:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)
    except Exception as exc:
        raise UsageError(f"the tokenizer's chat template failed on the conversation: "
                         f"{type(exc).__name__}: {exc}") from None
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]
