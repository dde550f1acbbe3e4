"""`specc compile`: checkpoint → capture → passes → (train) → lower → engine."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx as fx

from specc.capture.export import capture
from specc.capture.load import check_dtype, load_model, load_tokenizer, resolve_checkpoint
from specc.engine.format import BACKENDS
from specc.engine.save import check_output_dir, staging_dir, write_manifest, write_program
from specc.errors import UsageError
from specc.lower.backends import package_aoti
from specc.methods.descriptor import get_method
from specc.passes.manager import readable_graph, run_passes
from specc.program import ProgramGraph, SpeculativeProgram
from specc.progress import StageReporter

log = logging.getLogger("specc")


@dataclass
class CompileRequest:
    model: str
    method: str
    output: Path
    backend: str = "eager"
    dtype: str = "float32"
    max_seq_len: int = 1024
    force: bool = False
    settings: list[str] = field(default_factory=list)   # method config as key=value
    draft_model: str | None = None
    show_progress: bool = False


def validate(request: CompileRequest):
    """Check everything cheap before any heavy work starts."""
    if request.backend not in BACKENDS:
        raise UsageError(f"unknown backend {request.backend!r}; choose one of: {', '.join(BACKENDS)}")
    check_dtype(request.dtype)
    if not 8 <= request.max_seq_len <= 1 << 17:
        raise UsageError(f"--max-seq-len {request.max_seq_len} must be between 8 and 131072")
    method = get_method(request.method)
    if request.backend not in method.backends:
        raise UsageError(f"method {method.name!r} does not support backend {request.backend!r} yet; "
                         f"use one of: {', '.join(method.backends)}")
    settings = list(request.settings)
    if request.draft_model is not None:
        if not method.needs_draft_model:
            raise UsageError(f"--draft-model is only used by methods that need a draft model, not {method.name!r}")
        settings.append(f"draft_model={request.draft_model}")
    config = method.config_class.from_assignments(settings)
    if method.needs_draft_model and not getattr(config, "draft_model", None):
        raise UsageError(f"method {method.name!r} needs a draft model; pass --draft-model DIR")
    check_output_dir(request.output, request.force)
    return method, config


def compile_engine(request: CompileRequest) -> dict:
    start = time.perf_counter()
    method, config = validate(request)
    progress = StageReporter(request.show_progress)
    checkpoint = resolve_checkpoint(request.model)
    with progress.stage("loading checkpoint"):
        models = {"target": load_model(checkpoint, request.dtype)}
        if method.needs_draft_model:
            models["draft"] = load_model(resolve_checkpoint(config.draft_model), request.dtype)
            _check_same_vocabulary(models["target"], models["draft"])
        tokenizer = load_tokenizer(checkpoint)
    with progress.stage("capturing with torch.export and running passes"):
        program = build_program(models, method, config, request.max_seq_len)
    method_state = {}
    if method.train is not None:
        with progress.stage(f"training/calibrating {method.name}"):
            program.added_weights, method_state = split_train_result(method.train(program, config, tokenizer))
    with staging_dir(request.output, request.force) as staging:
        with progress.stage("writing engine"):
            tables = write_program(staging, program, tokenizer)
        with progress.stage(f"lowering ({request.backend})"):
            lowering_seconds = _lower_ahead_of_time(staging, program, request)
        report = {
            "method": method.name, "method_config": config.to_json(), "backend": request.backend,
            "dtype": request.dtype, "max_seq_len": request.max_seq_len, "lossless": method.lossless,
            "source_checkpoint": str(checkpoint),
            "passes": [r.to_json() for r in program.pass_records],
            **({"method_state": method_state} if method_state else {}),
            "compile_seconds": {"total": round(time.perf_counter() - start, 3),
                                "lowering": round(lowering_seconds, 3), "stages": progress.seconds},
            **tables,
        }
        write_manifest(staging, report)
    return report


def split_train_result(result: dict) -> tuple[dict, dict]:
    """A train step returns its trained weights by name, plus optionally, under
    the key `method_state`, JSON-ready state for the manifest (e.g. a searched
    skip set) that the engine exposes as `LoadedEngine.method_state`."""
    weights = dict(result)
    return weights, weights.pop("method_state", {})


def build_program(models: dict, method, config, max_seq_len: int) -> SpeculativeProgram:
    """Capture each source model once; every named graph rewrites its own copy of the capture."""
    program = SpeculativeProgram()
    captures = {}
    for name, recipe in method.graphs(config).items():
        if recipe.source not in models:
            raise UsageError(f"method {method.name!r} needs a {recipe.source!r} model")
        if recipe.source not in captures:
            captured = capture(models[recipe.source], max_seq_len)
            captures[recipe.source] = (captured, readable_graph(captured.graph_module))
        captured, captured_text = captures[recipe.source]
        gm, records = run_passes(name, _graph_copy(captured.graph_module), recipe.passes(config))
        program.graphs[name] = ProgramGraph(name, recipe.source, gm, captured.architecture, captured_text)
        program.pass_records += records
    return program


def _graph_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule with its own graph (passes rewrite graphs in place) over
    the same parameter tensors, so a second graph costs no weight memory."""
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _lower_ahead_of_time(staging: Path, program: SpeculativeProgram, request: CompileRequest) -> float:
    if request.backend != "aoti":
        return 0.0
    (staging / "compiled").mkdir()
    seconds = 0.0
    dtype = getattr(torch, request.dtype)
    for name, graph in program.graphs.items():
        log.info("packaging %s with AOTInductor", name)
        seconds += package_aoti(graph.module, graph.architecture, dtype, request.max_seq_len,
                                staging / "compiled" / f"{name}.pt2")
    return seconds


def _check_same_vocabulary(target, draft) -> None:
    if target.config.vocab_size != draft.config.vocab_size:
        raise UsageError(
            f"the draft model's vocabulary ({draft.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size}); pass a draft model that shares the target's tokenizer"
        )
