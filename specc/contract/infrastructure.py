"""The passes every cached decoding graph needs, in their required order."""

from __future__ import annotations

from specc.passes.base import GraphPass
from specc.passes.expose_position_ids import ExposePositionIds
from specc.passes.insert_attention_mask import InsertAttentionMask
from specc.passes.insert_kv_cache import InsertKVCache



def infrastructure_passes() -> list[GraphPass]:
    return [ExposePositionIds(), InsertAttentionMask(), InsertKVCache()]
