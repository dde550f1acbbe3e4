"""Calls run at one fixed row count in reduced precision, so verification is exact.

In bfloat16 the CPU kernels round a row differently depending on how many rows
its call has: unpadded, a call's first row differed from a one-row decode step
often enough, and by enough, to flip bfloat16's frequent near-ties. Padded to
one fixed count, a row computes the same values whatever the other rows hold:
every row of padded calls matched the decode steps under eager and Inductor, and
under AOTI everywhere but where a call straddled a key block
(`specc.runtime.masks.rows_in_key_block`). Measurements:
docs/backends.md#measurements-behind-the-lowering-choices. This module is the
mechanism; which calls are padded, and what that allows a drafter, is decided in
`specc.runtime.exactness`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specc.graph.nodes import rows_computed_alike
from specc.runtime.exactness import EXACT_ROWS, RowExactness, padded_rows
from specc.graph.signature import LOGIT_ROWS_DIM



@dataclass(frozen=True)
class RowPadding:
    """Runs a call of fewer than `rows` query rows as exactly `rows` rows, the last
    row repeated, and returns the real rows' outputs. A repeated row has the same
    token, position, mask row and cache slot as the row it copies, so it writes the
    same K/V to the same slot. The rows whose logits the call asks for (an `r` axis:
    `specc.passes.select_logit_rows`) grow to `rows` too, the last repeated, so the
    LM head runs over as many rows as the rest of the graph."""

    rows: int
    inputs: tuple[tuple[int, int], ...]    # (index, q axis) of every input with a q axis
    outputs: tuple[tuple[int, int], ...]   # the same for outputs
    logit_inputs: tuple[tuple[int, int], ...] = ()    # (index, r axis) of inputs with an r axis
    logit_outputs: tuple[tuple[int, int], ...] = ()   # the same for outputs

    def __call__(self, forward, args: tuple):
        return self.unpad(forward(*self.pad(args)), self.real_rows(args))

    def real_rows(self, args) -> tuple[int, int | None]:
        """The call's query rows and logit rows (None: the graph has no r axis)."""
        return real_rows(args, self.inputs, self.logit_inputs)

    def pad(self, args) -> list:
        """`args` with every q axis, and every shorter r axis, grown to `rows` by repeating its last row."""
        args = list(args)
        for axes in (self.inputs, self.logit_inputs):
            real = _length(args, axes)
            if real is None or real >= self.rows:
                continue
            for index, axis in axes:
                last = args[index].narrow(axis, real - 1, 1)
                args[index] = torch.cat([args[index], *[last] * (self.rows - real)], dim=axis)
        return args

    def unpad(self, result, real: tuple[int, int | None], copy: bool = False):
        """The first real rows of each output with a q or r axis (all outputs copied with `copy`)."""
        single = not isinstance(result, (list, tuple))
        result = [result] if single else list(result)
        for axes, length in ((self.outputs, real[0]), (self.logit_outputs, real[1])):
            for index, axis in axes:
                result[index] = result[index].narrow(axis, 0, length)
        if copy:
            result = [r.clone() for r in result]
        return result[0] if single else result


def real_rows(args, inputs, logit_inputs) -> tuple[int | None, int | None]:
    """A call's query rows and logit rows, read on the inputs `inputs` and `logit_inputs`
    ((index, axis) pairs) name; None for an axis no input has."""
    return _length(args, inputs), _length(args, logit_inputs)


def _length(args, axes) -> int | None:
    if not axes:
        return None
    index, axis = axes[0]
    return args[index].shape[axis]


class PaddedRows:
    """`forward` with every call of fewer rows than `padding.rows` run padded."""

    def __init__(self, forward, padding: RowPadding):
        self.forward, self.padding = forward, padding

    def __call__(self, *args):
        index, axis = self.padding.inputs[0]
        if args[index].shape[axis] < self.padding.rows:
            return self.padding(self.forward, args)
        return self.forward(*args)


def exact_calls(forward, target, exactness: RowExactness):
    """`forward` (a lowered graph of lowering `target`) as the engine runs it: padded as
    `specc.runtime.exactness.padded_rows` decides for the backend's exactness and the graph."""
    alike = rows_computed_alike(target.module) if exactness is RowExactness.PADDED_UNLESS_ALIKE else None
    rows = padded_rows(exactness, target.dtype, alike)
    padding = None if rows is None else row_padding(target, rows)
    return forward if padding is None else PaddedRows(forward, padding)


def row_padding(target, rows: int = EXACT_ROWS) -> RowPadding | None:
    """The padding for a lowering target's graph; None when no input has a q axis."""
    return padding_for(target.signature, rows)


def padding_for(signature, rows: int) -> RowPadding | None:
    """The padding of a graph with `signature` to `rows`; None when no input has a q axis."""
    inputs = q_axes(signature.inputs)
    if not inputs:
        return None
    return RowPadding(rows, inputs, q_axes(signature.outputs), axes_named(signature.inputs, LOGIT_ROWS_DIM),
                      axes_named(signature.outputs, LOGIT_ROWS_DIM))


def q_axes(specs) -> tuple[tuple[int, int], ...]:
    return axes_named(specs, "q")


def axes_named(specs, dim: str) -> tuple[tuple[int, int], ...]:
    """(index, axis) of every spec with a `dim` axis."""
    return tuple((i, list(spec.shape).index(dim)) for i, spec in enumerate(specs) if dim in spec.shape)
