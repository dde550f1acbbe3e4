"""The corpus drafter drafts what most often followed the context's longest suffix in text the
target wrote, token by token, within the budget; it composes with other drafters and stays
lossless; the lookup corpus is read and capped as documented."""

from __future__ import annotations

import json

import pytest

from specc.capture.load import load_model
from specc.compiler import build_program
from specc.contract.descriptor import get_method
from specc.contract.drafter import DraftBudget
from specc.contract.sampling import SamplingConfig
from specc.data.token_corpus import corpus_token_sequences
from specc.errors import UsageError
from specc.runtime.compose import ComposedDrafter
from specc.runtime.context import MethodContext
from specc.runtime.corpus_lookup import CorpusDrafter, most_frequent_followers
from specc.runtime.generate import generate
from specc.runtime.ngram import NgramDrafter
from specc.testing.checkpoints import varied_prompts

BUDGET = DraftBudget(max_depth=8, max_nodes=32)
GREEDY = SamplingConfig()
MAX_SEQ_LEN = 96
NEW_TOKENS = 24


def test_followers_are_the_most_frequent_next_token_of_every_ngram():
    followers = most_frequent_followers([[1, 2, 3, 4], [1, 2, 3, 5], [9, 2, 3, 5]], max_ngram=3)
    assert followers[(2, 3)] == 5            # 5 twice, 4 once
    assert followers[(1, 2, 3)] == 4         # a tie: the first seen
    assert followers[(3,)] == 5
    assert (3, 4) not in followers and (2, 3, 4, 5) not in followers   # nothing followed; longer than max


def test_a_draft_extends_by_the_longest_suffix_the_corpus_holds():
    drafter = CorpusDrafter([[1, 2, 3, 4, 6, 7], [8, 3, 5, 0]], max_ngram=3)
    draft = drafter.propose([9, 1, 2, 3], BUDGET, GREEDY, None)
    # (1, 2, 3) -> 4; then (2, 3, 4) -> 6; (3, 4, 6) -> 7; then nothing follows 7.
    assert draft.node_tokens.tolist() == [3, 4, 6, 7]
    assert draft.tree.parent == (-1, 0, 1, 2)
    assert draft.node_scores is None


def test_a_draft_keeps_to_the_budget_and_its_token_limit():
    corpus = [list(range(1, 30))]
    assert CorpusDrafter(corpus, num_draft_tokens=5).propose([1], BUDGET, GREEDY, None).node_tokens.numel() == 6
    chains = DraftBudget(max_depth=8, max_nodes=4, chain_only=True)
    assert CorpusDrafter(corpus).propose([1], chains, GREEDY, None).node_tokens.tolist() == [1, 2, 3, 4]
    shallow = DraftBudget(max_depth=2, max_nodes=32)
    assert CorpusDrafter(corpus).propose([1], shallow, GREEDY, None).node_tokens.tolist() == [1, 2, 3]


def test_no_draft_when_no_suffix_occurred():
    assert CorpusDrafter([[1, 2, 3]]).propose([7, 8], BUDGET, GREEDY, None) is None
    with pytest.raises(UsageError, match="max_ngram"):
        CorpusDrafter([[1, 2]], max_ngram=0)


@pytest.fixture(scope="module")
def target(checkpoints):
    program = build_program({"target": load_model(checkpoints("llama")[0])}, get_method("none"),
                            get_method("none").config_class(), MAX_SEQ_LEN)
    return MethodContext.eager(program, MAX_SEQ_LEN).model("target")


@pytest.mark.parametrize("max_rows", [None, 4])
def test_a_corpus_of_the_targets_own_text_is_accepted_and_stays_lossless(target, one_thread, max_rows):
    """The corpus: the target's greedy continuations of other prompts, as distill-data writes."""
    prompts = varied_prompts(12, MAX_SEQ_LEN, seed=21)
    written = [p + generate(target, None, p, NEW_TOKENS, GREEDY, MAX_SEQ_LEN).token_ids for p in prompts[6:]]
    composed = ComposedDrafter({"lookup": NgramDrafter(3, 1, 8), "corpus": CorpusDrafter(written)})
    for prompt in prompts[:6]:
        plain = generate(target, None, prompt, NEW_TOKENS, GREEDY, MAX_SEQ_LEN, max_rows=max_rows)
        speculative = generate(target, composed, prompt, NEW_TOKENS, GREEDY, MAX_SEQ_LEN, max_rows=max_rows)
        assert speculative.token_ids == plain.token_ids, f"prompt {prompt}"
    assert composed.method_report()["branches"]["corpus"]["accepted_tokens"] > 0


class WordTokenizer:
    def __call__(self, text, add_special_tokens=False, verbose=False):
        return {"input_ids": [len(word) for word in text.split()]}


def test_the_lookup_corpus_reads_distill_files_and_stops_at_the_cap(tmp_path, caplog):
    records = [{"text": "aa bbb c", "prompt_tokens": 1}, {"text": "dddd ee", "prompt_tokens": 1}]
    path = tmp_path / "replies.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    other = tmp_path / "more.txt"
    other.write_text("fffff\n\ng")
    assert corpus_token_sequences(WordTokenizer(), f"{path},{other}") == [[2, 3, 1], [4, 2], [5], [1]]
    assert corpus_token_sequences(WordTokenizer(), str(path), max_tokens=4) == [[2, 3, 1]]
    assert "keeps the first 3" in caplog.text
    with pytest.raises(UsageError, match="text the target wrote"):
        corpus_token_sequences(WordTokenizer(), f"builtin,{path}")
