"""A compile-time step shared by drafters that run a copy of an LM head: cut a
graph's head to the most frequent tokens of calibration text.

Only token frequencies are needed (nothing is trained). Counting is cheap
and more text ranks the rare end of the head better, so many windows are
counted (coverage by window count: benchmarks/NOTES.md, "Measurements once
cited in code"). The held-out share covered is recorded. The chosen ids go to
the manifest state, where the graph's recipe cuts the head with them
(`after_training`: the pass is recorded with the graph's other passes,
`specc inspect`) and the runtime maps drafted rows back to token ids.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from specc.contract.descriptor import TrainingContext, TrainResult
from specc.passes.reduce_draft_vocabulary import DraftVocabularyConfig
from specc.runtime.draft_logits import DRAFT_VOCABULARY_KEY
from specc.train.corpus import token_windows
from specc.train.vocabulary import frequent_tokens

WINDOW_TOKENS = 128
WINDOWS = 4096          # counted (fewer if the text is shorter)
HELDOUT_WINDOWS = 8     # not counted: the coverage estimate
HEAD_WEIGHT = f"{DraftVocabularyConfig.module_name}.weight"


def reduce_draft_head(context: TrainingContext, config, graph_name: str, tokenizer, label: str,
                      state: dict | None = None) -> TrainResult:
    """Cut graph `graph_name`'s LM head to `config.draft_vocab_size` rows, the most frequent
    tokens of `config.calib_data`. The reduced head's weight (stored with the method's own
    parameters) and, as state, its token ids and the share of held-out calibration tokens they
    cover; nothing when the size keeps the full head. The head is cut by building the graph
    again with the ids (and the rest of the method's `state`, which its recipe may read).
    `label` prefixes the report line."""
    arch = context.program.graphs[graph_name].architecture
    if not 0 < config.draft_vocab_size < arch.vocab_size:
        return TrainResult()
    windows = token_windows(tokenizer, config.calib_data, WINDOW_TOKENS, WINDOWS, HELDOUT_WINDOWS, seed=0)
    ids = frequent_tokens(windows.train, arch, config.draft_vocab_size)
    reduced = context.build(config, {**(state or {}), DRAFT_VOCABULARY_KEY: ids}, names=(graph_name,))
    coverage = float(torch.isin(torch.cat(windows.heldout), torch.tensor(ids)).float().mean())
    tqdm.write(f"{label}: the {graph_name} graph's head keeps {len(ids)} of {arch.vocab_size} tokens, "
               f"{coverage:.1%} of held-out calibration tokens ({windows.source})")
    head = reduced.graphs[graph_name].module.get_parameter(HEAD_WEIGHT)
    return TrainResult({HEAD_WEIGHT: head.detach().clone()},
                       {DRAFT_VOCABULARY_KEY: ids, "calibration": windows.source,
                        "draft_vocabulary_heldout_coverage": round(coverage, 4)})
