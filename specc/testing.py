"""Seeded tiny random checkpoints of every supported family, for tests and examples.

Random weights are enough to test losslessness: a speculative engine must
reproduce greedy decoding for any weights.
"""

from __future__ import annotations

from pathlib import Path

TINY_VOCAB = 96
_COMMON = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


def tiny_config(family: str, **overrides):
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "phi3": transformers.Phi3Config,
    }
    extra = {"mistral": {"sliding_window": None}, "qwen3": {"head_dim": 16}}.get(family, {})
    return classes[family](**{**_COMMON, **extra, **overrides})


def build_tiny_checkpoint(family: str, directory: Path, seed: int = 0, **overrides) -> Path:
    """Write a seeded random model of `family` plus a word-level tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config)
    # Random init is tiny; widen the logits so greedy decoding is not a near-tie everywhere.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tiny_tokenizer(config.vocab_size).save_pretrained(directory)
    return directory


def tiny_tokenizer(vocab_size: int = TINY_VOCAB):
    """Word-level tokenizer: 'w5 w17' ↔ ids [5, 17] (0 pad, 1 bos, 2 eos, 3 unk)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
