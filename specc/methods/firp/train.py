"""Train FIRP's projections at compile time: one step after another, the target frozen.

Teacher: the `target` graph on a window of T tokens (no pseudo rows), run
once per window, with the state leaving layer t_i - 1 for every t_i as extra
outputs. Kept in memory: its top-k next-token probabilities at every
position, its K/V of the layers from t_1 on, and those states.

Student for step i: a deep cut of the `target` graph at t_i (layers
t_i..L-1, the LM head; built by `build_program` from the target's recipe
and `expose_layer_exit`, sharing the target's weights and projections)
over one pseudo row per anchor position p, entering
as W_i h_p + b_i (the projection the graph applies at t_i) at position p + i.
Row p attends to the teacher's K/V of positions 0..p, to the pseudo rows
(p, j < i) of the steps already trained, and to itself — exactly what a
pseudo row sees at inference. It is trained towards the target's
distribution at real position p + i (teacher-forced; soft cross-entropy,
which is KL(target ‖ pseudo) plus the target's entropy: the same gradient).
After step i is trained its pseudo rows run once more per window, and their
K/V is kept for the later steps. Only W_i and b_i move while step i trains.

The report (manifest state) carries the layers, the held-out top-1
agreement of each step with the target before and after its training, the
distillation reports and the time spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from tqdm import tqdm

from specc.console.progress import progress_bar
from specc.graph.signature import CACHE_ROLE, read_signature
from specc.contract.descriptor import TARGET, GraphRecipe, TrainingContext, TrainResult
from specc.passes.expose_layer_exit import EXIT_ROLE, ExposeLayerExit, LayerExitConfig
from specc.methods.firp import target_passes
from specc.passes.expose_layer_inputs import ExposeLayerInputs, LayerInputsConfig
from specc.methods.firp.insert_pseudo_hidden_projections import PSEUDO_SOURCE_ROLE, PSEUDO_STEP_ROLE
from specc.contract.program import SpeculativeProgram
from specc.train.corpus import token_windows
from specc.train.distill import DistillConfig, SparseTarget, distill, sparse_target
from specc.train.heap import releasing
from specc.train.inputs import decoding_inputs

MODULE = "firp_proj"


@dataclass
class Window:
    """One window's frozen teacher outputs, and the K/V of the steps trained so far."""

    tokens: torch.Tensor                     # [T]
    target: SparseTarget                     # the target's next-token distribution at each position
    hidden: dict[int, torch.Tensor]          # t -> [T, hidden]: the state leaving layer t - 1
    kv: list[torch.Tensor | None]            # per cache input: [1, kv_heads, (k+1)T + 1, head_dim]; None below t_1


def train_projections(context: TrainingContext, config, tokenizer) -> TrainResult:
    """The projections' weights by name, and the training report as state."""
    start = time.perf_counter()
    target = context.program.graphs["target"].module
    arch = context.program.graphs["target"].architecture
    layers = config.pass_config().resolve(arch.num_layers)
    parameters = projection_parameters(target)
    state = {"num_layers": arch.num_layers, "pseudo_layers": list(layers), "steps": len(layers),
             "projections": {f"{MODULE}.{i}": f"step {i}: rows with pseudo_step == {i} take it after decoder layer "
                                              f"{t - 1} (t_{i} = {t})" for i, t in enumerate(layers, start=1)},
             "pseudo_rows": config.pseudo_rows, "tree_widths": list(config.widths()),
             "pseudo_positions": "k rows per anchor node after the tree's rows (scratch slots, never committed); "
                                 "row (v, i): position pos(v) + i, sees v's prefix and ancestors, v, (v, j <= i)",
             "training": None}
    if config.train_steps == 0:
        return TrainResult(_copies(parameters), state)
    for name, p in target.named_parameters():
        if name not in parameters:
            p.requires_grad_(False)   # the target is frozen
    windows = token_windows(tokenizer, config.calib_data, config.train_seq_len, config.train_windows,
                            config.eval_sequences, config.seed)
    def build(recipes: dict[str, GraphRecipe]) -> SpeculativeProgram:
        return context.build_graphs(recipes, config)
    teacher = WindowTeacher(teacher_graph(build, target, layers), arch, layers, config.teacher_top_k)
    bar = progress_bar(windows.train, desc="firp: running the target once per window", unit="window")
    train = [teacher(w) for w in releasing(bar)]
    heldout = [teacher(w) for w in releasing(windows.heldout)]
    teacher_seconds = time.perf_counter() - start
    cuts = deep_cuts(build, target, layers)
    reports, before, after = [], [], []
    for i, t in enumerate(layers, start=1):
        student = PseudoStudent(cuts[t], t, i, parameters[f"{MODULE}.{i}.weight"], parameters[f"{MODULE}.{i}.bias"])
        report = distill(student, student.teacher, [student.weight, student.bias], train, heldout,
                         DistillConfig(steps=config.train_steps, learning_rate=config.learning_rate,
                                       warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                                       grad_clip=config.grad_clip, eval_every=config.eval_every,
                                       seed=config.seed + i),
                         description=f"firp: step {i}/{len(layers)} (layer {t})")
        before.append(round(report.initial.acceptance, 4))
        after.append(round(report.final.acceptance, 4))
        reports.append(report.to_json())
        if i < len(layers):   # the later steps attend to this one's pseudo rows
            with torch.no_grad():
                for window in train + heldout:
                    student.keep_pseudo_kv(window)
    tqdm.write(f"firp: trained on {windows.source}; held-out agreement by step "
               f"{_percent(before)} → {_percent(after)}")
    state.update(calibration=windows.source, training=reports,
                 heldout_agreement_by_step={"before": before, "after": after},
                 teacher_seconds=round(teacher_seconds, 3), train_seconds=round(time.perf_counter() - start, 3))
    return TrainResult(_copies(parameters), state)


def projection_parameters(target: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in target.named_parameters() if name.startswith(MODULE + ".")}


def projection_tensors(target: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The projections of a compiled program (parameters) or of a loaded engine graph (buffers)."""
    named = [*target.named_parameters(), *target.named_buffers()]
    return {name: t for name, t in named if name.startswith(MODULE + ".")}


def deep_cut_recipes(layers: tuple[int, ...]) -> dict[str, GraphRecipe]:
    """Per distinct layer t: the target's graph cut at the exit of t layers, keeping layers
    t..L-1 and the LM head (a student's graph, built only for training)."""
    def recipe(layer: int) -> GraphRecipe:
        return GraphRecipe(TARGET, lambda c: [*target_passes(c), ExposeLayerExit(LayerExitConfig(layer, "deep"))])
    return {_cut_name(t): recipe(t) for t in sorted(set(layers))}


def deep_cuts(build: Callable[[dict[str, GraphRecipe]], SpeculativeProgram], target: fx.GraphModule,
              layers: tuple[int, ...]) -> dict[int, fx.GraphModule]:
    """Layer t -> the deep cut at t (`deep_cut_recipes`, built by `build` from the capture
    `target` came from, so the frozen weights are shared), reading `target`'s own projections."""
    program = build(deep_cut_recipes(layers))
    projections = projection_tensors(target)
    cuts = {t: program.graphs[_cut_name(t)].module for t in sorted(set(layers))}
    for gm in cuts.values():
        _share(gm, projections)
    return cuts


TEACHER_GRAPH = "firp-teacher"


def _cut_name(layer: int) -> str:
    return f"firp-deep-{layer}"


def _share(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Make the tensors `module` holds under these names the given ones (a cut built apart from
    the target gets projections of its own; the student must read the ones being trained)."""
    held = {name for name, _ in [*module.named_parameters(), *module.named_buffers()]}
    for name in sorted(held & tensors.keys()):
        owner, _, leaf = name.rpartition(".")
        holder = module.get_submodule(owner)
        delattr(holder, leaf)
        if isinstance(tensors[name], torch.nn.Parameter):
            holder.register_parameter(leaf, tensors[name])
        else:
            holder.register_buffer(leaf, tensors[name])


def teacher_graph(build: Callable[[dict[str, GraphRecipe]], SpeculativeProgram], target: fx.GraphModule,
                  layers: tuple[int, ...]) -> fx.GraphModule:
    """The target that also returns the state entering each pseudo layer t (`ExposeLayerInputs`:
    one teacher forward gives the logits and every projection's input), built by `build` from
    the capture `target` came from, reading `target`'s own projections."""
    recipe = GraphRecipe(TARGET, lambda c: [*target_passes(c),
                                            ExposeLayerInputs(LayerInputsConfig(tuple(sorted(set(layers)))))])
    graph = build({TEACHER_GRAPH: recipe}).graphs[TEACHER_GRAPH].module
    _share(graph, projection_tensors(target))
    return graph


def graph_inputs(gm: fx.GraphModule, values: dict[str, object], caches: list[torch.Tensor]) -> list:
    """The graph's inputs in signature order, by role (caches in order)."""
    cache_iter = iter(caches)
    return [next(cache_iter) if spec.role == CACHE_ROLE else values[spec.role]
            for spec in read_signature(gm).inputs]


class WindowTeacher:
    """window → `Window`: the frozen target's outputs on it, with room for the pseudo K/V;
    `graph` is the target returning the states entering the pseudo layers (`teacher_graph`)."""

    def __init__(self, graph: fx.GraphModule, arch, layers: tuple[int, ...], top_k: int):
        self.graph = graph
        self.arch = arch
        self.layers = layers
        self.top_k = top_k
        self.exits = sorted(set(layers))
        self.dtype = next(t.dtype for t in [*graph.parameters(), *graph.buffers()] if t.is_floating_point())

    def __call__(self, window: torch.Tensor) -> Window:
        length = window.numel()
        tokens, positions, mask, slots = decoding_inputs(window, self.arch.sliding_window)
        rows = torch.arange(length)[None]
        values = {"tokens": tokens, "positions": positions, "attention_mask": mask, "cache_slots": slots,
                  PSEUDO_SOURCE_ROLE: rows, PSEUDO_STEP_ROLE: torch.zeros_like(rows)}
        with torch.no_grad():
            caches = self._caches(length)
            logits, *exits = self.graph(*graph_inputs(self.graph, values, caches))
        hidden = {t: h[0] for t, h in zip(self.exits, exits)}
        kv = [cache if index >= 2 * self.layers[0] else None for index, cache in enumerate(caches)]
        return Window(window, sparse_target(torch.softmax(logits[0].float(), dim=-1), self.top_k), hidden, kv)

    def _caches(self, length: int) -> list[torch.Tensor]:
        """Room for the real rows and one pseudo row per position and step (one spare slot)."""
        shape = (1, self.arch.num_key_value_heads, (len(self.layers) + 1) * length + 1, self.arch.head_dim)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(2 * self.arch.num_layers)]


class PseudoStudent:
    """Step i's pseudo rows for every anchor p = 0..T-1-i of a window, through `deep`, the
    target cut at t_i (`deep_cuts`); logits [T - i, vocab]."""

    def __init__(self, deep: fx.GraphModule, layer: int, step: int, weight, bias):
        self.deep = deep
        self.layer, self.step = layer, step
        self.weight, self.bias = weight, bias

    def teacher(self, window: Window) -> tuple[SparseTarget, Window]:
        """The target's distribution at real position p + i for each anchor p."""
        i, t = self.step, window.target
        return SparseTarget(t.indices[i:], t.probs[i:], t.top1[i:]), window

    def __call__(self, window: Window) -> torch.Tensor:
        logits, _ = self._run(window)
        return logits

    def keep_pseudo_kv(self, window: Window) -> None:
        """Store this step's pseudo K/V (layers >= t_i) for the later steps."""
        _, caches = self._run(window)
        length, i = window.tokens.numel(), self.step
        region = slice(i * length, (i + 1) * length)
        for index, cache in enumerate(caches):
            if index >= 2 * self.layer and window.kv[index] is not None:
                window.kv[index][:, :, region] = cache[:, :, region]

    def _run(self, window: Window) -> tuple[torch.Tensor, list[torch.Tensor]]:
        length, i = window.tokens.numel(), self.step
        rows = length - i
        anchors = torch.arange(rows)
        columns = torch.arange((i + 1) * length)
        sees = columns[None, :] <= anchors[:, None]                          # the real prefix 0..p
        for j in range(1, i + 1):                                            # (p, j) for j <= i
            sees |= columns[None, :] == (j * length + anchors)[:, None]
        slots = i * length + anchors
        pseudo = torch.nn.functional.linear(window.hidden[self.layer][:rows], self.weight, self.bias)
        values = {"tokens": torch.zeros(1, rows, dtype=torch.long), "positions": (anchors + i)[None],
                  "attention_mask": sees[None, None], "cache_slots": slots,
                  PSEUDO_SOURCE_ROLE: anchors[None], PSEUDO_STEP_ROLE: torch.zeros(1, rows, dtype=torch.long),
                  EXIT_ROLE: pseudo[None]}
        unused = next(c for c in window.kv if c is not None)
        caches = [unused if kv is None or index < 2 * self.layer else kv.clone() for index, kv in enumerate(window.kv)]
        (logits,) = self.deep(*graph_inputs(self.deep, values, caches))
        return logits[0], caches


def _copies(parameters: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in parameters.items()}


def _percent(values: list[float]) -> str:
    return "/".join(f"{100 * v:.0f}%" for v in values)
