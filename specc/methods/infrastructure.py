"""The passes every cached decoding graph needs, in their required order."""

from __future__ import annotations

from specc.passes.base import GraphPass
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.passes.insert_kv_cache import InsertKVCache


# The inputs these passes give a graph, in order; the per-layer k/v caches follow.
DECODING_INPUTS = ("input_ids", "position_ids", "attn_mask", "cache_positions")


def infrastructure_passes() -> list[GraphPass]:
    return [ExposePositionIds(), InsertAttentionMask(), InsertKVCache()]
