"""SWIFT's layer-set search: candidates, Bayesian suggestions, stop rules,
and that it finds skip sets with higher matchness than the initial one."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.methods.swift.search import LayerSetSearch, SearchSettings, describe_skip_set, odd_layers
from specc.testing.checkpoints import build_tiny_checkpoint, varied_prompts

SUBLAYERS = tuple(f"{kind}_{i}" for i in range(1, 7) for kind in ("attn", "mlp"))


def test_initial_set_is_the_odd_layers_and_candidates_have_the_fixed_ratio():
    search = LayerSetSearch(SUBLAYERS)
    assert search.best == odd_layers(SUBLAYERS) == {"attn_1", "mlp_1", "attn_3", "mlp_3", "attn_5", "mlp_5"}
    assert describe_skip_set(search.best) == "attn 1,3,5 · mlp 1,3,5"
    assert search.num_skipped == int(0.45 * 12)
    assert all(len(search.suggest()) == 5 for _ in range(10))


def test_every_bayes_interval_th_try_asks_the_gaussian_process(monkeypatch):
    settings = SearchSettings(bayes_interval=5, seed=3)
    search, twin = LayerSetSearch(SUBLAYERS, settings), LayerSetSearch(SUBLAYERS, settings)
    asked = []
    bayesian = LayerSetSearch._bayesian
    monkeypatch.setattr(LayerSetSearch, "_bayesian", lambda self: asked.append(self.state.tries) or bayesian(self))
    good = {"attn_2", "mlp_2", "attn_4", "mlp_4", "attn_6"}
    for _ in range(10):
        candidate, again = search.suggest(), twin.suggest()
        assert candidate == again and len(candidate) == 5, "the search is deterministic for a seed"
        score = len(candidate & good) / 5
        search.report(candidate, score)
        twin.report(again, score)
    assert asked == [4, 4, 9, 9], "tries 5 and 10 come from the GP, for both searches"
    assert search.state.tries == 10 and len(search.state.observed) == 10
    assert search.state.best_score == max(score for _, score in search.state.observed)


def test_stop_rules():
    search = LayerSetSearch(SUBLAYERS, SearchSettings(max_score=0.9))
    search.rescore(0.5)
    assert not search.report(frozenset({"attn_1"}), 0.4) and search.active
    assert search.report(frozenset({"attn_2"}), 0.95) and not search.active
    assert search.best == {"attn_2"} and "0.950" in search.state.stop_reason

    patient = LayerSetSearch(SUBLAYERS, SearchSettings(max_tolerance=3))
    patient.rescore(0.8)
    for _ in range(3):
        patient.report(frozenset({"mlp_6"}), 0.1)
    assert not patient.active and "without improvement" in patient.state.stop_reason

    capped = LayerSetSearch(SUBLAYERS, SearchSettings(max_tries=4))
    capped.rescore(0.0)
    for score in (0.1, 0.2, 0.3, 0.4):
        capped.report(capped.suggest(), score)
    assert not capped.active and capped.state.best_score == 0.4
    assert json.loads(json.dumps(capped.state.to_json()))["tries"] == 4


def test_search_raises_matchness_over_the_initial_set(tmp_path):
    """On a model whose even layers barely change the residual stream (their
    output projections are scaled down), the odd-layer initial set skips the
    layers that matter; the search, run as `specc compile` calibration, must
    find a set that agrees with the full model far more often."""
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "ckpt", num_hidden_layers=6)
    weights = load_file(str(checkpoint / "model.safetensors"))
    for layer in (2, 4):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            weights[f"model.layers.{layer}.{name}.weight"] *= 0.05
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    data = tmp_path / "calib.txt"
    data.write_text("\n\n".join(" ".join(f"w{t}" for t in ids) for ids in varied_prompts(3, 96, seed=4)) + "\n")
    compile_engine(CompileRequest(model=str(checkpoint), method="swift", output=tmp_path / "engine", max_seq_len=96,
                                  settings=[f"calib_data={data}", "calib_prompts=3", "calib_max_new_tokens=20",
                                            "context_window=12", "max_tries_per_prompt=15", "adapt=false"]))
    engine = load_engine(tmp_path / "engine")
    found = engine.drafter.skip_set
    initial = odd_layers(engine.drafter.skippable)
    scores = {"found": [], "initial": []}
    for ids in varied_prompts(8, 96, seed=99)[2:]:
        tokens = ids + engine.generate_ids(ids, 20).token_ids
        if len(tokens) - len(ids) < 13:
            continue
        with torch.inference_mode():
            scores["found"].append(engine.drafter.matchness(tokens, len(ids), found))
            scores["initial"].append(engine.drafter.matchness(tokens, len(ids), initial))
    mean = {k: sum(v) / len(v) for k, v in scores.items()}
    assert len(scores["found"]) >= 4
    assert mean["found"] > mean["initial"] + 0.2, mean
