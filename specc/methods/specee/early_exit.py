"""One SpecEE decoding step: draft-head candidates, then layers until a guarded exit.

For a token at a slot, the draft head (EAGLE-1 style, reading the previous
token's top-layer feature) proposes K candidates; the target then runs
layer by layer, and after each scheduled layer whose predictor fires, the
full LM head runs on that layer's state: the token exits there only if the
head's argmax is one of the candidates (the guard). The schedule is the
offline set measured at compile time plus an online window (-2, 0, +2)
around the exit layers of the last few tokens.
"""

from __future__ import annotations

from collections import deque

import torch

from specc.methods.specee.finish_rows import FinishingRows
from specc.methods.specee.layerwise import LayerwiseForward, LayerwiseResult
from specc.runtime.cached_model import CachedModel
from specc.runtime.draft_follower import DraftFollower
from specc.runtime.kv_cache import KVCache
from specc.runtime.masks import causal_chunk_mask


class ExitSchedule:
    def __init__(self, offline: tuple[int, ...], scored: tuple[int, ...], online_tokens: int):
        self.offline = frozenset(offline) & frozenset(scored)
        self.scored = frozenset(scored)
        self.recent: deque[int] = deque(maxlen=online_tokens)

    def layers(self) -> frozenset[int]:
        online = {e + d for e in self.recent for d in (-2, 0, 2)}
        return self.offline | (online & self.scored)

    def record(self, exit_layer: int) -> None:
        if self.recent.maxlen and exit_layer in self.scored:
            self.recent.append(exit_layer)

    def reset(self) -> None:
        self.recent.clear()


class DraftHead:
    """The draft-head graph with its own KV cache; top-K candidates in vocabulary ids."""

    def __init__(self, model: CachedModel, vocabulary: torch.Tensor | None, candidates: int):
        self.model = model
        self.vocabulary = vocabulary
        self.k = candidates

    def candidates(self, token: int, slot: int, feature: torch.Tensor) -> torch.Tensor:
        """[1, K] for the token at `slot` after the previous token's `feature` [hidden]."""
        device = self.model.device
        slots = torch.tensor([slot], device=device)
        mask = torch.ones(1, 1, 1, slot + 1, dtype=torch.bool, device=device)
        logits = self.model.run(torch.tensor([token], device=device), slots, slots, mask, feature[None, None]).logits
        return self.to_vocabulary(logits.topk(self.k, dim=-1).indices)

    def prime(self, tokens: torch.Tensor, start: int, features: torch.Tensor) -> None:
        """Write the head's KV for `tokens` at slots start.. given each previous token's feature [n, hidden]."""
        device = self.model.device
        slots = torch.arange(start, start + tokens.numel(), device=device)
        self.model.run(tokens, slots, slots, causal_chunk_mask(start, tokens.numel(), device), features[None],
                       last_logits_only=True)   # the KV writes are wanted, no logits: the fewest rows

    def to_vocabulary(self, indices: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices as target token ids."""
        return indices if self.vocabulary is None else self.vocabulary[indices]


class EarlyExit:
    """Steps single tokens through the layer-wise target on a shared KV cache."""

    def __init__(self, layerwise: LayerwiseForward, head: DraftHead, cache: KVCache, schedule: ExitSchedule,
                 threshold: float, device):
        self.layerwise = layerwise
        self.head = head
        self.cache = cache
        self.schedule = schedule
        self.threshold = threshold
        self.device = device
        # `mask` policy: which slots a layer holds no K/V for (their token exited below it).
        self.missing = torch.zeros(layerwise.num_layers, cache.max_seq_len + 1, dtype=torch.bool, device=device)
        self.finishing = (FinishingRows(layerwise, cache.tensors, device) if layerwise.kv_policy == "finish"
                          else None)
        self.exit_layers: list[int] = []   # every early-exit step's last layer, across sequences
        self.guard_checks = 0              # full-head evaluations after a predictor fired

    def reset(self) -> None:
        """A new sequence: no slot is missing anywhere, nothing pending, no recent exits."""
        self.missing.zero_()
        if self.finishing is not None:
            self.finishing.reset()
        self.schedule.reset()

    def finish_pending(self) -> None:
        """`finish` policy: complete every exited token's remaining layers now (before a chunk
        that the full model runs, which reads every layer)."""
        if self.finishing is not None:
            self.finishing.finish(torch.zeros(1, self.head.k, dtype=torch.long, device=self.device))

    def step(self, token: int, slot: int, feature: torch.Tensor, force_exit: int | None = None) -> LayerwiseResult:
        """One token through the layers; `force_exit` (warm-up, tests) exits at that layer unconditionally
        (a layer without a predictor, such as the top one: never early)."""
        candidates = self.head.candidates(token, slot, feature)
        slots = torch.tensor([slot], device=self.device)
        mask = torch.ones(1, 1, 1, slot + 1, dtype=torch.bool, device=self.device)
        inputs = (torch.tensor([[token]], device=self.device), slots[None], mask, slots, *self.cache.tensors,
                  candidates)
        scheduled = self.schedule.layers()

        def decide(layer: int, score: torch.Tensor, hidden: torch.Tensor):
            if force_exit is not None:
                return self.layerwise.head(hidden, inputs) if layer == force_exit else None
            if layer not in scheduled or float(score) <= self.threshold:
                return None
            self.guard_checks += 1
            logits = self.layerwise.head(hidden, inputs)
            return logits if bool((candidates == logits[0, -1].argmax()).any()) else None

        if self.finishing is not None:
            result = self.finishing.step(token, slot, candidates, decide)
        else:
            masks = self._layer_masks if self.layerwise.kv_policy == "mask" else None
            result = self.layerwise.run(inputs, decide, masks)
        self.missing[:, slot] = False
        if self.layerwise.kv_policy == "mask":
            self.missing[result.exit_layer + 1:, slot] = True
        self.schedule.record(result.exit_layer)
        self.exit_layers.append(result.exit_layer)
        return result

    def take_report(self) -> dict:
        """Early-exit steps since the last report: each one's layers executed, and their mean."""
        executed = [layer + 1 for layer in self.exit_layers]
        guard_checks, self.exit_layers, self.guard_checks = self.guard_checks, [], 0
        report = {"early_exit_steps": len(executed), "guard_checks": guard_checks,
                  "exits": sum(layer < self.layerwise.num_layers for layer in executed), "layers_executed": executed,
                  "mean_layers_executed": round(sum(executed) / len(executed), 3) if executed else None,
                  "num_layers": self.layerwise.num_layers}
        if self.finishing is not None:
            report["finished_row_layers"], self.finishing.finished_row_layers = self.finishing.finished_row_layers, 0
        return report

    def written_by_full_model(self, slots: torch.Tensor) -> None:
        """Slots a full forward just wrote at every layer."""
        self.missing[:, slots] = False

    def layer_mask(self, layer: int, mask: torch.Tensor) -> torch.Tensor | None:
        """Layer `layer`'s attention mask under the `mask` policy (None: the step's own mask)."""
        return self._layer_masks(layer, mask) if self.layerwise.kv_policy == "mask" else None

    def _layer_masks(self, layer: int, mask: torch.Tensor) -> torch.Tensor | None:
        missing = self.missing[layer, : mask.shape[-1]]
        return mask & ~missing if bool(missing.any()) else None


FEATURE = "final_hidden"   # top-layer (or exit-layer) state: the draft head's next input


def previous_features(features: torch.Tensor, before: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's draft-head input: the feature of the token before it (zeros before the first)."""
    first = torch.zeros_like(features[:1]) if before is None else before[None]
    return torch.cat([first, features[:-1]])


class FollowsAcceptedTokens:
    """A drafter whose draft head must stay in step with what the target accepted: the head's KV
    holds each committed token with the target's feature of the token before it, kept by a
    `DraftFollower`. Before a round drafts, the head catches up on the committed positions it
    has not seen (the prompt, the tokens accepted since, a root it did not draft from); the root
    itself runs through the head as the draft's first step, with the target's feature. The
    accepted tokens are read from the draft the target verified, which may be another branch's
    (`specc.runtime.compose`)."""

    early: EarlyExit
    follower: DraftFollower

    def _catch_up(self, tokens: list[int]) -> torch.Tensor:
        """Prime the head on the committed positions before the root it has not seen, in one call;
        the root's input feature (the target's of the token before it)."""
        root = len(tokens) - 1
        start = self.follower.valid
        if start < root:
            positions = torch.arange(start, root, device=self.early.device)
            self.early.head.prime(torch.tensor(tokens[start:root], device=self.early.device), start,
                                  self.follower.feature_before(positions))
        self.follower.caught_up(root)
        return self.follower.feature_before(root)


def head_follower(full: CachedModel) -> DraftFollower:
    """The follower of a draft head that reads the target's top-layer feature (`FEATURE`)."""
    return DraftFollower(full.max_seq_len, full.device, FEATURE, full.architecture.hidden_size,
                         full.cache.tensors[0].dtype)
