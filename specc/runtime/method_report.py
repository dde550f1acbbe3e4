"""What a method's own runtime says about its generations, beside `GenerationStats`."""

from __future__ import annotations


def method_report(runtime) -> dict:
    """What the method's own runtime reports about the generations since it was last asked
    (`method_report()` on its drafter, else on its target; {} when neither has one), e.g.
    per-token exit layers or a composed drafter's branch counts. Asking starts the counts
    again, so call it once after each generation."""
    for part in (runtime.drafter, runtime.target):
        if part is not None and part.capabilities.reports:
            return part.method_report()
    return {}
