"""`eager`: execute the rewritten FX graph itself."""

from __future__ import annotations

from specc.lower.backend import EXTRA_INPUTS, EXTRA_OUTPUTS, RUN_TIME_SEGMENTS, Backend


class EagerBackend(Backend):
    name = "eager"
    help = "execute the rewritten FX graph (no compilation)"
    capabilities = frozenset({RUN_TIME_SEGMENTS, EXTRA_INPUTS, EXTRA_OUTPUTS})

    def load(self, target, artifacts, manifest):
        return target.module


BACKEND = EagerBackend()
