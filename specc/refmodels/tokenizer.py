"""Byte-level BPE tokenizer for the reference models (GPT-2 style, no UNK token).

``<|endoftext|>`` is the only special token and serves as bos, eos and pad. It
separates documents in the training stream; encoding a prompt adds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ENDOFTEXT = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT],
        # Seeding all 256 byte symbols keeps every input encodable, whatever the corpus held.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def endoftext_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(ENDOFTEXT)
    if token_id is None:
        raise ValueError(f"tokenizer has no {ENDOFTEXT} token")
    return token_id


def encode_documents(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """One token stream: every document followed by ``<|endoftext|>``."""
    separator = endoftext_id(tokenizer)
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts), add_special_tokens=False):
        stream.extend(encoding.ids)
        stream.append(separator)
    return stream


def save_tokenizer(tokenizer: Tokenizer, directory: Path, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json, loadable with ``AutoTokenizer``."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        model_max_length=model_max_length,
        # The default cleanup rewrites " ," to "," and would corrupt decoded code.
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(str(directory))
