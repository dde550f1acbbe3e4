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
from typing import NamedTuple

import torch

from specc.data.corpora import CorpusUnavailableError, heldout_prompts
from specc.host.cpuinfo import has_bfloat16_units
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
    windows = [torch.tensor([ids], device=model.device) for ids in heldout_windows(tokenizer)]
    with float32_products(model):
        reference = [_scored(model, tokens) for tokens in windows]
    with quantized_linears(model, scheme):   # packs each weight once for every window
        quantized = [_scored(model, tokens) for tokens in windows]
    agree = sum(int((ref.top1 == quant.top1).sum()) for ref, quant in zip(reference, quantized))
    total = sum(tokens.shape[1] for tokens in windows)
    predicted = total - len(windows)
    nll = {"reference": sum(s.nll for s in reference), "quantized": sum(s.nll for s in quantized)}
    return {"top1_agreement": round(agree / max(total, 1), 4), "tokens": total, "windows": len(windows),
            "perplexity": {name: round(math.exp(value / max(predicted, 1)), 3) for name, value in nll.items()}}


class _Scored(NamedTuple):
    top1: torch.Tensor   # the model's greedy choice after every token of the window
    nll: float           # the summed negative log-likelihood of the window's tokens after its first


def _scored(model: torch.nn.Module, tokens: torch.Tensor) -> _Scored:
    logits = model(tokens).logits[0].float()
    return _Scored(logits.argmax(-1),
                   float(torch.nn.functional.cross_entropy(logits[:-1], tokens[0, 1:], reduction="sum")))


@contextlib.contextmanager
def float32_products(model: torch.nn.Module):
    """On a CPU without bfloat16 units, every half-precision `nn.Linear` of `model` multiplying in
    float32 and rounding its output to its own dtype, restored on exit: the products a bfloat16
    matmul accumulates in float32 anyway, without oneDNN's emulation of the missing units, which
    makes the unquantized reference the slowest part of a compile's measurement."""
    if model.device.type != "cpu" or has_bfloat16_units():
        yield
        return
    swapped = [module for module in model.modules() if isinstance(module, torch.nn.Linear)
               and module.weight.dtype in (torch.bfloat16, torch.float16)]
    for module in swapped:
        module.forward = _float32_forward(module)
    try:
        yield
    finally:
        for module in swapped:
            del module.forward


def _float32_forward(linear: torch.nn.Linear):
    def forward(x: torch.Tensor) -> torch.Tensor:
        bias = None if linear.bias is None else linear.bias.float()
        return torch.nn.functional.linear(x.float(), linear.weight.float(), bias).to(x.dtype)
    return forward


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
