"""The values a config field allows, declared beside its default: `option(4, "help", at_least=1)`.

`MethodConfig` checks every field against its bounds in one place when a config is made
(from `--set`, a manifest or Python), and `specc methods` prints them. A field a config
redeclares to change its default keeps the bounds its option block declared, as it keeps
its help. Checks that relate fields to each other stay in the config's `__post_init__`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specc.errors import UsageError

BOUND_KEYS = ("at_least", "at_most", "above", "below", "choices")


@dataclass(frozen=True)
class Bounds:
    at_least: float | None = None    # inclusive lower bound
    at_most: float | None = None     # inclusive upper bound
    above: float | None = None       # exclusive lower bound
    below: float | None = None       # exclusive upper bound
    choices: tuple | None = None

    @classmethod
    def from_metadata(cls, metadata) -> "Bounds | None":
        declared = {key: metadata[key] for key in BOUND_KEYS if key in metadata}
        if "choices" in declared:
            declared["choices"] = tuple(declared["choices"])
        return cls(**declared) if declared else None

    def allows(self, value) -> bool:
        if self.choices is not None:
            return value in self.choices
        return ((self.at_least is None or value >= self.at_least) and (self.at_most is None or value <= self.at_most)
                and (self.above is None or value > self.above) and (self.below is None or value < self.below))

    def check(self, name: str, value) -> None:
        """Raise a `UsageError` naming the field, the value and what is allowed."""
        if not self.allows(value):
            shown = repr(value) if isinstance(value, str) else value
            raise UsageError(f"{name}={shown} must be {self.describe()}")

    def describe(self) -> str:
        """What is allowed, in words: "between 1 and 16", "in [0, 1)", "0 or more", "one of a, b"."""
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        low = self.at_least if self.at_least is not None else self.above
        high = self.at_most if self.at_most is not None else self.below
        if low is not None and high is not None:
            if self.at_least is not None and self.at_most is not None:
                return f"between {low} and {high}"
            return f"in {'[' if self.at_least is not None else '('}{low}, {high}{']' if self.at_most is not None else ')'}"
        if low is not None:
            if self.above is not None:
                return "positive" if low == 0 else f"above {low}"
            return f"{low} or more" if low == 0 else f"at least {low}"
        return f"at most {high}" if self.at_most is not None else f"below {high}"
