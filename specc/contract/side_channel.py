"""What a method's drafter hands its own verifier beside a draft, or its target hands its own
drafter beside a verification: one typed record that no other part of the loop reads."""

from __future__ import annotations

from typing import TypeVar

from specc.errors import SpeccError


class SideChannel:
    """Base of a method's side channel: subclass it as a dataclass of tensors. A `Draft` or a
    `Verification` carries at most one (`carries`), which the method's own part takes back by
    type (`carried`); the loop and composition pass it on or refuse it, never look inside."""


Channel = TypeVar("Channel", bound=SideChannel)


def carried(holder, kind: type[Channel]) -> Channel | None:
    """`holder.carries` (a `Draft`'s or a `Verification`'s) when it is a `kind`, None when it
    carries nothing; another method's record is a wiring error, named."""
    record = holder.carries
    if record is None or isinstance(record, kind):
        return record
    raise SpeccError(f"a {type(holder).__name__} carries a {type(record).__name__}, but its reader expects a "
                     f"{kind.__name__}: a drafter's side channel reached another method's target (or the other "
                     f"way round); check which target and drafter the method's runtime pairs")
