"""FIRP's runtime: drafting rides inside verification.

`PseudoRowTarget` is the loop's target. Every forward it runs — prefill,
a plain step, tree verification — carries, besides its real rows, k pseudo
rows for each *anchor* row (the prompt's last token; the tree nodes chosen
by `pseudo_rows`). Pseudo row (v, i) has position pos(v) + i; from layer t_i
on it is W_i h_v + b_i (the `target` graph's `pseudo_source`/`pseudo_step`
inputs say so) and attends to what v attends to, v itself and the pseudo
rows (v, j < i). Real rows never attend to pseudo rows, so the real rows'
logits are the plain target's.

Pseudo rows write K/V to scratch slots after the real rows' slots. The loop
commits only accepted tree rows (which lie before the scratch), and every
later forward writes a slot before reading it up to the committed length
plus its own rows, so scratch K/V is never read again. When the scratch does
not fit in the cache (the last tokens before max_seq_len) the forward runs
without pseudo rows and the next round decodes one token.

Where the backend computes only so many rows exactly (bfloat16: `exact_rows`),
a forward carries pseudo rows only when all its rows fit them and end in the
key block its first row ends in, as the loop's budget has them do (1 + k rows
per node: with k = 1, a drafted token and both nodes' pseudo rows are 4 rows);
otherwise the next round decodes one token. So a prompt's prefill carries none
(its rows are rounded as the `none` engine's prefill rounds them), and the
one-token step after it carries the first pseudo rows.

`PseudoStateDrafter` keeps the pseudo logits of the row whose real logits
chose the latest token (the last accepted node) and proposes the next tree
from them: the root is that token, depth d comes from pseudo step d.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specc.contract.drafter import Capabilities, Draft, DraftBudget, MethodRuntime
from specc.contract.sampling import SamplingConfig
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeSpec, TreeTensors, tree_tensors
from specc.contract.verification import Acceptance, Verification
from specc.methods.firp.config import FIRPConfig
from specc.runtime.cached_model import CachedModel, chunk_layout, tree_layout
from specc.runtime.exactness import exact_call_rows
from specc.runtime.per_depth_drafts import sampled_chain, top_k_fan
from specc.runtime.sampling import probabilities

@dataclass(frozen=True)
class PseudoRows(SideChannel):
    """What a verification carries to the drafter: the logits of each anchor's pseudo rows."""

    logits: torch.Tensor            # [anchors, k, vocab]
    nodes: tuple[int, ...]          # the row (tree node) of each anchor


class PseudoRowTarget:
    """The `target` graph with k pseudo rows per anchor row in every forward."""

    capabilities = Capabilities(resumable=True)   # committed K/V are the plain target's; pseudo rows: scratch

    def __init__(self, model: CachedModel, steps: int, pseudo_rows: str, exact_rows: int | None = None):
        self.model = model
        self.steps = steps
        self.pseudo_rows = pseudo_rows
        self.exact_rows = exact_rows
        self.architecture = model.architecture
        self.device = model.device
        self.max_seq_len = model.max_seq_len

    @property
    def cache(self):
        return self.model.cache

    @property
    def forward_passes(self) -> int:
        return self.model.forward_passes

    def prefill(self, tokens: torch.Tensor, start: int) -> Verification:
        """A causal chunk; its last token is the anchor."""
        n = tokens.numel()
        positions, slots, mask = chunk_layout(start, n, self.device)
        anchors = (n - 1,)
        layout = None if self._no_room(start, n, anchors) else pseudo_layout(torch.ones(n, n).tril().bool(),
                                                                               anchors, self.steps)
        return self._forward(tokens, positions, slots, mask, start, anchors, layout)

    def verify_tree(self, draft: Draft, prefix_len: int) -> Verification:
        positions, slots, mask = tree_layout(draft, prefix_len, self.device)
        anchors = anchor_nodes(draft.tree, self.pseudo_rows)
        n = draft.node_tokens.numel()
        layout = None if self._no_room(prefix_len, n, anchors) else tree_pseudo_layout(draft.tree.spec, anchors,
                                                                                      self.steps)
        return self._forward(draft.node_tokens, positions, slots, mask, prefix_len, anchors, layout)

    def commit(self, base: int, accepted_offsets: list[int]) -> None:
        self.model.commit(base, accepted_offsets)

    def _no_room(self, start: int, n: int, anchors: tuple[int, ...]) -> bool:
        """Whether the pseudo rows' scratch slots would run past the cache, or the call past
        the rows the backend computes exactly."""
        rows = n + len(anchors) * self.steps
        cap = exact_call_rows(start, self.max_seq_len, self.exact_rows)
        return start + rows > self.max_seq_len or (cap is not None and rows > cap)

    def _forward(self, tokens, positions, slots, mask, start: int, anchors: tuple[int, ...],
                 layout) -> Verification:
        """The real rows at `slots` (`mask`: theirs), then, with a layout, the anchors'
        pseudo rows at the slots after them."""
        n, k = tokens.numel(), self.steps
        if layout is None:
            rows = torch.arange(n, device=self.device)[None]
            return self.model.run(tokens, positions, slots, mask, rows, torch.zeros_like(rows))
        local_mask, offsets, source, step = (t.to(self.device) for t in layout)
        anchor_rows = source[n:]
        verification = self.model.run(
            torch.cat([tokens, tokens[anchor_rows]]), torch.cat([positions, positions[anchor_rows] + offsets[n:]]),
            torch.arange(start, start + source.numel(), device=self.device), _with_prefix(start, local_mask),
            source[None], step[None])
        logits = verification.logits
        return Verification(logits[:n], verification.outputs, slots,
                            carries=PseudoRows(logits[n:].view(len(anchors), k, -1), anchors))


def _with_prefix(start: int, local: torch.Tensor) -> torch.Tensor:
    """[1, 1, r, start + r]: every row sees the committed prefix, then `local` among the rows."""
    prefix = torch.ones(local.shape[0], start, dtype=torch.bool, device=local.device)
    return torch.cat([prefix, local], dim=1)[None, None]


def anchor_nodes(tree: TreeTensors, pseudo_rows: str) -> tuple[int, ...]:
    """The tree nodes that get pseudo rows: every node, or the root and the top-1 chain."""
    if pseudo_rows == "all":
        return tuple(range(tree.ancestor_mask.shape[0]))
    return (0, *tree.chain_nodes)


@lru_cache(maxsize=256)
def tree_pseudo_layout(spec: TreeSpec, anchors: tuple[int, ...], k: int):
    """`pseudo_layout` of a tree shape, built once per shape."""
    return pseudo_layout(tree_tensors(spec).ancestor_mask, anchors, k)


def pseudo_layout(local: torch.Tensor, anchors: tuple[int, ...], k: int):
    """For n real rows whose mutual visibility is `local` [n, n], plus k pseudo rows per
    anchor (anchor-major, step-minor): the mask among the n + m rows [n + m, n + m]; each
    row's position offset from its anchor's (real rows: 0); each row's `pseudo_source`
    (its anchor; a real row: itself) and `pseudo_step` (real rows: 0).

    Pseudo row (v, i) sees what v sees, v, and (v, j) for j <= i."""
    n, m = local.shape[0], len(anchors) * k
    anchor_of = torch.tensor(anchors, dtype=torch.long).repeat_interleave(k)
    step_of = torch.arange(1, k + 1).repeat(len(anchors))
    mask = torch.zeros(n + m, n + m, dtype=torch.bool)
    mask[:n, :n] = local
    mask[n:, :n] = local[anchor_of]
    mask[n:, n:] = (anchor_of[:, None] == anchor_of[None, :]) & (step_of[None, :] <= step_of[:, None])
    offsets = torch.cat([torch.zeros(n, dtype=torch.long), step_of])
    source = torch.cat([torch.arange(n), anchor_of])
    step = torch.cat([torch.zeros(n, dtype=torch.long), step_of])
    return mask, offsets, source, step


class PseudoStateDrafter:
    capabilities = Capabilities(resumable=True)   # it keeps the last forward's pseudo logits; begin reads them

    def __init__(self, config: FIRPConfig, vocab_size: int, eos_token_ids, device):
        self.config = config
        self.steps = config.num_steps
        self.widths = config.widths()
        self.device = device
        self._eos = set(eos_token_ids)
        self._pending: torch.Tensor | None = None   # [k - shift, vocab]: logits for depth 1, 2, …

    def begin(self, prompt: torch.Tensor, prefill: Verification) -> None:
        # The anchor is the prefill's last row, numbered within the rows it computed:
        # after a reused prefix those are the prompt's last rows only.
        self._keep(prefill, [prefill.logits.shape[0] - 1])

    def observe(self, draft: Draft | None, acceptance: Acceptance | None, verification: Verification) -> None:
        self._keep(verification, [0] if draft is None else acceptance.path)

    def _keep(self, verification: Verification, path: list[int]) -> None:
        """The pseudo logits of the deepest node on `path` that has pseudo rows, shifted
        by how far it lies above the path's end (a sibling leaf has none with pseudo_rows=chain)."""
        self._pending = None
        pseudo = carried(verification, PseudoRows)
        if pseudo is None:
            return
        for shift, node in enumerate(reversed(path)):
            if node in pseudo.nodes:
                logits = pseudo.logits[pseudo.nodes.index(node)]
                self._pending = logits[shift:] if shift < self.steps else None
                return

    def propose(self, tokens: list[int], budget: DraftBudget, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Draft | None:
        if self._pending is None:
            return None
        depth = min(self._pending.shape[0], budget.max_depth, budget.max_nodes - 1)
        if depth < 1:
            return None
        logits = self._pending[:depth]
        if not sampling.greedy and all(w == 1 for w in self.widths):
            return self._sampled_chain(tokens[-1], logits, sampling, generator)
        return self._top_k_tree(tokens[-1], logits, budget.max_nodes, sampling)

    def _sampled_chain(self, root_token: int, logits: torch.Tensor, sampling: SamplingConfig,
                       generator: torch.Generator | None) -> Draft:
        """Each depth sampled from its pseudo step's distribution q_d (Leviathan acceptance)."""
        return sampled_chain(root_token, probabilities(logits, sampling), self._eos, generator)

    def _top_k_tree(self, root_token: int, logits: torch.Tensor, max_nodes: int, sampling: SamplingConfig) -> Draft:
        """The configured widths: the top-w of each step, the first continuing the chain."""
        scores = logits.float() if sampling.greedy else probabilities(logits, sampling)
        return top_k_fan(root_token, scores, list(self.widths), max_nodes, self._eos)


def build_runtime(context, config: FIRPConfig) -> MethodRuntime:
    model = context.model("target")
    arch = model.architecture
    return MethodRuntime(PseudoRowTarget(model, config.num_steps, config.pseudo_rows, context.exact_rows),
                         PseudoStateDrafter(config, arch.vocab_size, arch.eos_token_ids, model.device))
