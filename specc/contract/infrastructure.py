"""The passes every cached decoding graph needs, in their required order."""

from __future__ import annotations

from specc.passes.base import GraphPass
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.passes.insert_kv_cache import InsertKVCache
from specc.passes.window_sliding_layers import WindowSlidingLayers


def infrastructure_passes() -> list[GraphPass]:
    return [ExposePositionIds(), InsertAttentionMask(), InsertKVCache(), WindowSlidingLayers()]
