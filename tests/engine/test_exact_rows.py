"""Drafts capped at the rows a backend computes exactly as a decode step (reduced precision)."""

from __future__ import annotations

import json

import torch

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.lower.aoti import NARROW_ROWS_BF16, AOTInductorBackend
from specc.lower.eager import EagerBackend
from specc.runtime.masks import KEY_BLOCK, rows_in_key_block
from specc.testing import assert_matches_hf_greedy, recording_rounds, varied_prompts

MAX_NEW_TOKENS = 24


def test_aoti_caps_bfloat16_drafts_at_the_padded_decode_rows():
    backend = AOTInductorBackend()
    assert backend.exact_rows(torch.bfloat16) == NARROW_ROWS_BF16 == 4
    assert backend.exact_rows(torch.float32) is None
    assert EagerBackend().exact_rows(torch.bfloat16) is None


def test_a_lossless_engine_drafts_chains_within_the_cap_and_one_key_block(checkpoints, tmp_path,
                                                                         prompt_lookup_method, monkeypatch):
    monkeypatch.setattr(EagerBackend, "exact_rows", lambda self, dtype: 4)
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="prompt-lookup", output=tmp_path / "e", max_seq_len=96))
    engine = load_engine(tmp_path / "e")
    assert engine.max_draft_rows == 4
    verified = []
    observe = engine.runtime.drafter.observe

    def record(draft, acceptance, verification):
        if draft is not None:
            verified.append((draft.tree.parent, verification.slots.tolist()))
        observe(draft, acceptance, verification)

    engine.runtime.drafter.observe = record
    prompts = varied_prompts(12, 96, seed=11) + [list(range(5, 60))]   # the last one generates across 64 keys
    results = assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target, prompts,
                                       MAX_NEW_TOKENS)
    assert sum(r.stats.accepted_tokens for r in results) > 0
    assert max(n for r in results for n in r.stats.drafted_per_round) == 3, "the root and three nodes fill four rows"
    assert verified
    for parents, slots in verified:
        assert parents == tuple(range(-1, len(parents) - 1)), "a chain, each node after its parent"
        assert len(slots) <= rows_in_key_block(slots[0], engine.max_seq_len)
    assert any(slots[0] >= KEY_BLOCK - 4 for _, slots in verified), "some rounds ran just before the boundary"

    _, _, observed = recording_rounds(engine.runtime)
    for _ in engine.rounds(varied_prompts(1, 96, seed=11)[0], MAX_NEW_TOKENS):
        pass
    assert observed and all(tree.depth.numel() <= 4 for tree, _ in observed), "streaming keeps the cap too"


def test_a_lossy_engine_is_not_capped(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(EagerBackend, "exact_rows", lambda self, dtype: 2)
    target, _ = checkpoints("llama")
    compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "e", max_seq_len=96))
    assert load_engine(tmp_path / "e").max_draft_rows == 2
    manifest = tmp_path / "e" / "manifest.json"
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"lossless": False}))
    assert load_engine(tmp_path / "e").max_draft_rows is None, "a lossy method promises no identity to cap for"
