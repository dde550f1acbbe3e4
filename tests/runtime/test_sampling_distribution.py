"""Speculative sampling must leave the target's distribution exactly intact.

Over a tiny vocabulary we enumerate the target's exact distribution of
the 2nd and 3rd generated tokens and compare it with what the engines
emit over many seeded runs (chi-square). A broken acceptor — one that
keeps every draft token — must fail the same test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

import specc.runtime.generate as generate_module
from specc.compiler import CompileRequest, compile_engine
from specc.contract.sampling import SamplingConfig
from specc.contract.verification import Acceptance
from specc.engine.loaded import load_engine
from specc.runtime.sampling import probabilities
from specc.testing.checkpoints import build_tiny_checkpoint

VOCAB = 8
PROMPT = [5, 6, 7]
RUNS = 1500
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    # eos outside the reachable ids so every run generates the full length
    target = build_tiny_checkpoint("llama", root / "target", seed=0, vocab_size=VOCAB, eos_token_id=VOCAB + 5,
                                   bos_token_id=1, pad_token_id=0)
    draft = build_tiny_checkpoint("llama", root / "draft", seed=1, noise_from=target, noise=0.5)
    return root, target, draft


def exact_pair_distribution(target, sampling: SamplingConfig) -> dict[tuple[int, int], float]:
    """P(t2, t3) = sum over t1 of p(t1) p(t2 | t1) p(t3 | t1, t2)."""
    model = AutoModelForCausalLM.from_pretrained(target).eval()

    def next_probs(ids):
        with torch.inference_mode():
            return probabilities(model(torch.tensor([ids])).logits[0, -1], sampling)

    p1 = next_probs(PROMPT)
    pairs = dict.fromkeys(itertools.product(range(VOCAB), repeat=2), 0.0)
    for t1 in range(VOCAB):
        p2 = next_probs(PROMPT + [t1])
        for t2 in range(VOCAB):
            p3 = next_probs(PROMPT + [t1, t2])
            for t3 in range(VOCAB):
                pairs[(t2, t3)] += float(p1[t1] * p2[t2] * p3[t3])
    return pairs


def empirical_pairs(engine, sampling: SamplingConfig) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    drafted = 0
    for seed in range(RUNS):
        result = engine.generate_ids(PROMPT, 4, SamplingConfig(sampling.temperature, sampling.top_p, seed))
        key = tuple(result.token_ids[1:3])
        counts[key] = counts.get(key, 0) + 1
        drafted += result.stats.drafted_tokens
    assert drafted > 0, "the engine never drafted: the test would not exercise the acceptor"
    return counts


def chi_square_p_value(exact: dict, counts: dict) -> float:
    """Cells with expected count < 5 are pooled so the statistic is valid."""
    observed, expected, pooled_o, pooled_e = [], [], 0.0, 0.0
    for cell, prob in exact.items():
        e = prob * RUNS
        if e < 5:
            pooled_o += counts.get(cell, 0)
            pooled_e += e
        else:
            observed.append(counts.get(cell, 0))
            expected.append(e)
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


def compile_draft_engine(root, target, draft, name, settings):
    out = root / name
    if not out.exists():
        compile_engine(CompileRequest(model=str(target), method="draft-model", output=out, max_seq_len=32,
                                      settings=[*settings, f"draft_model={draft}"]))
    return load_engine(out)


@pytest.mark.parametrize("name,settings,top_p", [
    ("chain", ["num_draft_tokens=3"], 1.0),
    ("tree", ["num_draft_tokens=3", "tree_width=3"], 1.0),
    ("tree-top-p", ["num_draft_tokens=3", "tree_width=2"], 0.9),
])
def test_speculative_sampling_matches_target_distribution(models, name, settings, top_p):
    root, target, draft = models
    sampling = SamplingConfig(temperature=1.0, top_p=top_p)
    engine = compile_draft_engine(root, target, draft, name, settings)
    p_value = chi_square_p_value(exact_pair_distribution(target, sampling), empirical_pairs(engine, sampling))
    assert p_value > 1e-3, f"{name}: emitted distribution differs from the target's (p={p_value:.2e})"


def test_a_wrong_acceptor_is_caught(models, monkeypatch):
    root, target, draft = models

    def accept_everything(node_tokens, draft_probs, target_probs, generator):
        n = node_tokens.numel()
        return Acceptance(list(range(n)), int(torch.multinomial(target_probs[n - 1], 1, generator=generator)))

    monkeypatch.setattr(generate_module, "accept_sampled_chain", accept_everything)
    engine = compile_draft_engine(root, target, draft, "chain", ["num_draft_tokens=3"])
    p_value = chi_square_p_value(exact_pair_distribution(target, SAMPLING), empirical_pairs(engine, SAMPLING))
    assert p_value < 1e-6, "accepting every draft token must distort the distribution detectably"
