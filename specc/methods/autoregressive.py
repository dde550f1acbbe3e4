"""Method `none`: plain autoregressive decoding through the compiled graph.

The honest baseline engine: same capture, passes and lowering as every
speculative method, one token per target forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.methods.config import MethodConfig
from specc.methods.descriptor import GraphRecipe, MethodDescriptor, register
from specc.methods.infrastructure import infrastructure_passes


@dataclass(frozen=True)
class AutoregressiveConfig(MethodConfig):
    pass


register(MethodDescriptor(
    name="none",
    summary="plain autoregressive decoding through the compiled graph (the baseline engine)",
    config_class=AutoregressiveConfig,
    graphs=lambda config: {"target": GraphRecipe("target", lambda c: infrastructure_passes())},
    make_drafter=lambda engine, config: None,
))
