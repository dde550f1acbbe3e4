"""Method `none`: plain autoregressive decoding through the compiled graph.

The honest baseline engine: same capture, passes and lowering as every
speculative method, one token per target forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.contract.config import MethodConfig
from specc.contract.descriptor import TARGET, GraphRecipe, MethodDescriptor
from specc.contract.drafter import MethodRuntime
from specc.contract.infrastructure import infrastructure_passes


@dataclass(frozen=True)
class AutoregressiveConfig(MethodConfig):
    pass


METHOD = MethodDescriptor(
    name="none",
    summary="plain autoregressive decoding through the compiled graph (the baseline engine)",
    config_class=AutoregressiveConfig,
    graphs=lambda config: {"target": GraphRecipe(TARGET, lambda c: infrastructure_passes())},
    build_runtime=lambda context, config: MethodRuntime(context.model("target")),
)
