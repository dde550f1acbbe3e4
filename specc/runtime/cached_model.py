"""A lowered graph with its KV cache: the callable the loop and drafters step.

The graph's inputs follow its declared signature: tokens [1, q],
positions [1, q], attention mask [1, 1, q, kv], cache slots [q], then the
KV caches (role `kv_cache`), then any method inputs, passed to `run_all`
after the caches, and last, in an engine's graphs, the rows whose logits
to compute (role `logit_rows`, `specc.passes.select_logit_rows`), which
this class fills in: every row, or in a prefill the last. Its output with
role `logits` ([1, q, vocab], or [1, r, vocab] for the rows asked) becomes
`Verification.logits`; every other output is returned by name in
`Verification.outputs`.
"""

from __future__ import annotations

from typing import Callable

import torch

from specc.capture.families import ArchitectureSummary
from specc.contract.drafter import Capabilities, Draft
from specc.contract.verification import Verification
from specc.errors import SpeccError
from specc.graph.signature import CACHE_ROLE, LOGIT_ROWS_ROLE, LOGITS_ROLE, GraphSignature
from specc.runtime.kv_cache import KVCache
from specc.runtime.masks import apply_sliding_window, causal_chunk_mask, pad_keys, padded_key_count, tree_mask
from specc.runtime.step_layouts import OneRowLayouts

DECODING_ROLES = ("tokens", "positions", "attention_mask", "cache_slots")
SHARED_LOGIT_ROWS = 64   # calls of up to this many rows reuse one logit_rows input per row count


class CachedModel:
    capabilities = Capabilities(resumable=True)   # the KV cache is all its per-token state

    def __init__(self, forward: Callable, signature: GraphSignature, architecture: ArchitectureSummary,
                 max_seq_len: int, dtype: torch.dtype, device="cpu", cache: KVCache | None = None):
        """`cache` lets a draft graph of the target (self-speculation) share the target's KV."""
        check_decoding_layout(signature)
        self.forward_fn = forward
        self.signature = signature
        self.architecture = architecture
        self.device = device
        caches = len(signature.inputs_with_role(CACHE_ROLE))
        self.cache = cache or KVCache(caches // 2, architecture.num_key_value_heads, architecture.head_dim,
                                      max_seq_len, dtype, device)
        roles = [spec.role for spec in signature.outputs]
        self._logits_index = roles.index(LOGITS_ROLE) if LOGITS_ROLE in roles else None
        self._selects_logit_rows = bool(signature.inputs_with_role(LOGIT_ROWS_ROLE))
        self._logit_rows_made: dict[tuple[int, bool], torch.Tensor] = {}
        self._one_row = OneRowLayouts(self.cache.max_seq_len, device)
        self.forward_passes = 0

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            mask: torch.Tensor, *extra_inputs: torch.Tensor, last_logits_only: bool = False) -> Verification:
        """Logits `[q, vocab]` (`[1, vocab]`, the last row's, with `last_logits_only`) and
        the other named outputs for `tokens` written at cache `slots`."""
        outputs = self.run_all(tokens, positions, slots, mask, *extra_inputs, last_logits_only=last_logits_only)
        named = {spec.name: out[0] for i, (spec, out) in enumerate(zip(self.signature.outputs, outputs))
                 if i != self._logits_index}
        logits = None if self._logits_index is None else outputs[self._logits_index][0]
        return Verification(logits, named, slots)

    def run_all(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                mask: torch.Tensor, *extra_inputs: torch.Tensor, last_logits_only: bool = False) -> tuple:
        """Every graph output, raw; `extra_inputs` follow the caches (method-specific inputs).
        The logits are every row's, or with `last_logits_only` the last row's (computed
        alone where the graph selects logit rows, cut from all rows' otherwise)."""
        tokens, positions, slots, mask = (t.to(self.device, non_blocking=True)
                                          for t in (tokens, positions, slots, mask))
        extra_inputs = [t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                        for t in extra_inputs]
        mask = pad_keys(apply_sliding_window(mask, positions, self.architecture.sliding_window), self.max_seq_len)
        if self._selects_logit_rows:
            extra_inputs.append(self._logit_rows(tokens.numel(), last_logits_only))
        outputs = self.forward_fn(tokens[None], positions[None], mask.contiguous(), slots,
                                  *self.cache.tensors, *extra_inputs)
        self.forward_passes += 1
        if last_logits_only and not self._selects_logit_rows and self._logits_index is not None:
            outputs = list(outputs)
            outputs[self._logits_index] = outputs[self._logits_index][:, -1:]
        return outputs

    def _logit_rows(self, rows: int, last_only: bool) -> torch.Tensor:
        """The `logit_rows` input of a call of `rows` rows; made once per row count for the
        short calls of the decoding loop (graph inputs are never written to, so calls share it)."""
        key = (rows, last_only)
        made = self._logit_rows_made.get(key)
        if made is None:
            made = torch.arange(rows - 1 if last_only else 0, rows, device=self.device)
            if rows <= SHARED_LOGIT_ROWS:
                self._logit_rows_made[key] = made
        return made

    def extend(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """The last row's logits `[1, vocab]` after a causal chunk of tokens after `start` cached ones."""
        return self.prefill(tokens, start).logits

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        """A causal chunk after `start` cached tokens; logits of its last row only, all the loop reads."""
        rows = tokens.numel()
        layout = (self._one_row.layout(start) if rows == 1
                  else chunk_layout(start, rows, self.device, self.max_seq_len))
        return self.run(tokens, *layout, last_logits_only=True)

    def run_chunk(self, tokens: torch.Tensor, start: int) -> Verification:
        """A causal chunk after `start` cached tokens, with every row's logits."""
        return self.run(tokens, *chunk_layout(start, tokens.numel(), self.device, self.max_seq_len))

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        """Score a flattened token tree whose root sits at slot `prefix_len`."""
        return self.run(draft.node_tokens, *tree_layout(draft, prefix_len, self.device))

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        self.cache.commit(base, accepted_offsets)


def chunk_layout(start: int, length: int, device,
                 max_keys: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, cache slots, mask) of a causal chunk of `length` tokens after `start` cached
    ones; with `max_keys`, the mask comes with `pad_keys`'s hidden columns already."""
    slots = torch.arange(start, start + length, device=device)
    keys = None if max_keys is None else max(start + length, padded_key_count(start + length, max_keys))
    return slots, slots, causal_chunk_mask(start, length, device, keys)


def tree_layout(draft: Draft, prefix_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, cache slots, mask) of a draft's flattened tree rooted at slot `prefix_len`."""
    slots = torch.arange(prefix_len, prefix_len + draft.node_tokens.numel(), device=device)
    return draft.tree.depth.to(device) + prefix_len, slots, tree_mask(prefix_len, draft.tree).to(device)


def check_decoding_layout(signature: GraphSignature) -> None:
    """Inputs: the four decoding inputs, the caches, then any others, the logit rows (if any) last."""
    roles = [spec.role for spec in signature.inputs]
    caches = [i for i, role in enumerate(roles) if role == CACHE_ROLE]
    contiguous = caches == list(range(len(DECODING_ROLES), len(DECODING_ROLES) + len(caches)))
    rows_last = LOGIT_ROWS_ROLE not in roles or roles.index(LOGIT_ROWS_ROLE) == len(roles) - 1
    if tuple(roles[:len(DECODING_ROLES)]) != DECODING_ROLES or not contiguous or len(caches) % 2 or not rows_last:
        raise SpeccError(f"graph inputs {signature.input_names} with roles {roles} are not the decoding layout "
                         f"({', '.join(DECODING_ROLES)}, then k/v caches, then method inputs, then any "
                         f"{LOGIT_ROWS_ROLE})")
