"""The positions, cache slots and mask of a one-row decode step, as views of tensors made once.

A decoding loop makes one such call per token. Built afresh (`chunk_layout`: two aranges, a
comparison, reshapes), its layout costs several torch operations a step, and on a CPU each of
them runs with cold caches: the weights the step before streamed evicted the interpreter's and
torch's working set (benchmarks/NOTES.md, "The 1.5B on eight prompts"). Here a step's layout is
slices of two tensors made with the model: the same values, shapes and dtypes as `chunk_layout`
gives for one row, the mask padded the same way (`padded_key_count`).
"""

from __future__ import annotations

import torch

from specc.runtime.masks import padded_key_count


class OneRowLayouts:
    """`layout(start)`: (positions, cache slots, mask) of one row after `start` cached tokens."""

    def __init__(self, max_seq_len: int, device):
        self._max_seq_len, self._device = max_seq_len, device
        self._tables: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}

    def layout(self, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not 0 <= start < self._max_seq_len:
            raise ValueError(f"a row after {start} cached tokens does not fit {self._max_seq_len} cache slots")
        slots, visible = self._tables_for_this_mode()
        keys = max(start + 1, padded_key_count(start + 1, self._max_seq_len))
        first = self._max_seq_len - 1 - start
        slot = slots[start:start + 1]
        return slot, slot, visible[first:first + keys].view(1, 1, 1, keys)

    def _tables_for_this_mode(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The slots and the visibility step, made in the grad mode of the call: views of an
        inference tensor are what `chunk_layout` makes under inference mode, down to the
        dispatch keys a compiled graph's guards check."""
        mode = torch.is_inference_mode_enabled()
        tables = self._tables.get(mode)
        if tables is None:
            slots = torch.arange(self._max_seq_len, device=self._device)
            # visible[max_seq_len - 1 - start + j] is True exactly for keys j <= start
            visible = torch.arange(2 * self._max_seq_len, device=self._device) < self._max_seq_len
            tables = self._tables[mode] = (slots, visible)
        return tables
