"""What quantization costs: the quantized model against the unquantized one on held-out text.

Top-1 agreement (how often both pick the same next token, the figure that decides how
often a quantized engine's greedy text follows the unquantized one's) and the perplexity
of each on the same windows of held-out code and English text (`specc.data.corpora`),
computed with the checkpoint's own modules, every linear layer the engine quantizes
swapped for the engine's matmul over the same packed weights.
"""

from __future__ import annotations

import contextlib
import logging
import math

import torch

from specc.data.corpora import CorpusUnavailableError, heldout_prompts
from specc.quantize.schemes import Scheme, scheme_for

log = logging.getLogger("specc")

WINDOWS_PER_KIND = 2
WINDOW_TOKENS = 256
WINDOW_CHARS = 4 * WINDOW_TOKENS * 2   # enough characters for a full window of tokens


def heldout_windows(tokenizer, per_kind: int = WINDOWS_PER_KIND, tokens: int = WINDOW_TOKENS) -> list[list[int]]:
    """Token windows of held-out code and, where the shared data is present, English text."""
    windows = []
    for kind in ("code", "text"):
        try:
            texts = heldout_prompts(kind, per_kind, WINDOW_CHARS)
        except CorpusUnavailableError as missing:
            log.info("quantization quality without %s windows: %s", kind, missing)
            continue
        windows += [ids[:tokens] for ids in (tokenizer(text)["input_ids"] for text in texts) if len(ids) > 1]
    return windows


@torch.no_grad()
def quantization_quality(model: torch.nn.Module, tokenizer, scheme: Scheme) -> dict:
    """Top-1 agreement and both perplexities of `model` quantized with `scheme` against itself."""
    windows = heldout_windows(tokenizer)
    agree = total = 0
    nll = {"reference": 0.0, "quantized": 0.0}
    for ids in windows:
        tokens = torch.tensor([ids], device=model.device)
        reference = model(tokens).logits[0].float()
        with quantized_linears(model, scheme):
            quantized = model(tokens).logits[0].float()
        agree += int((reference.argmax(-1) == quantized.argmax(-1)).sum())
        total += len(ids)
        for name, logits in (("reference", reference), ("quantized", quantized)):
            nll[name] += float(torch.nn.functional.cross_entropy(logits[:-1], tokens[0, 1:], reduction="sum"))
    predicted = total - len(windows)
    return {"top1_agreement": round(agree / max(total, 1), 4), "tokens": total, "windows": len(windows),
            "perplexity": {name: round(math.exp(value / max(predicted, 1)), 3) for name, value in nll.items()}}


@contextlib.contextmanager
def quantized_linears(model: torch.nn.Module, scheme: Scheme):
    """Every `nn.Linear` of `model` computing through `scheme`'s packed weight, restored on exit."""
    swapped = []
    for module, chosen in linear_schemes(model, scheme):
        module.forward = _quantized_forward(module, chosen, chosen.pack(module.weight))
        swapped.append(module)
    try:
        yield
    finally:
        for module in swapped:
            del module.forward


def linear_schemes(model: torch.nn.Module, scheme: Scheme):
    """Each floating `nn.Linear` of `model` with the scheme an engine packs its weight in
    (`scheme_for`; the one computing logits is the one with a row per vocabulary entry)."""
    vocab = model.config.vocab_size
    for module in list(model.modules()):
        if isinstance(module, torch.nn.Linear) and module.weight.is_floating_point():
            yield module, scheme_for(scheme, module.weight, logits=module.out_features == vocab)


def _quantized_forward(linear: torch.nn.Linear, scheme: Scheme, packed: dict):
    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = scheme.matmul(x.reshape(-1, linear.in_features).contiguous(), packed)
        out = rows.reshape(*x.shape[:-1], linear.out_features)
        return out if linear.bias is None else out + linear.bias
    return forward
