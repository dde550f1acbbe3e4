"""`specc compile`: checkpoint → capture → passes → (train) → lower → engine."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specc.capture.export import capture
from specc.capture.gguf import converted_head_type
from specc.capture.load import check_dtype, load_model, load_tokenizer, resolve_checkpoint
from specc.console.progress import StageReporter, progress_bar, ticking
from specc.contract.config import parse_assignments
from specc.contract.descriptor import (TARGET, GraphRecipe, MethodDescriptor, TrainingContext, check_backend,
                                      get_method)
from specc.contract.program import ProgramGraph, SpeculativeProgram, graph_copy
from specc.contract.quantization import Quantization, reads_target_weights_to_draft
from specc.engine.composition import check_composition, lookup_corpus_requested, lookup_corpus_state
from specc.engine.save import check_output_dir, staging_dir, write_manifest, write_program
from specc.errors import SpeccError, UsageError
from specc.graph.nodes import FROZEN_COPIES, attribute
from specc.graph.signature import read_signature, static_sizes
from specc.host.cpuinfo import emulates_bfloat16
from specc.host.device import device_kind, move_graph, resolve_device
from specc.kernels import kernel_revisions, kernels_in_graph
from specc.kernels.cpu.build import compiler
from specc.lower.backend import LoweringTarget
from specc.lower.registry import get_backend
from specc.passes.manager import readable_graph, run_passes
from specc.passes.fuse_decoder_chain import FuseDecoderChain
from specc.passes.stack_decoder_layers import StackDecoderLayers
from specc.passes.pad_attention_rows import PadAttentionRows
from specc.passes.quantize_linear_weights import QuantizeLinearWeights
from specc.passes.select_logit_rows import SelectLogitRows
from specc.passes.use_kernels import UseKernels
from specc.passes.use_row_attention import UseRowAttention
from specc.quantize.report import TARGET_REPORT, quantization_report
from specc.quantize.schemes import BLOCKED, Scheme, head_bits_for, parse_scheme
from specc.quantize.teacher import TEACHERS, round_linear_weights
from specc.runtime.exactness import EXACT_ROWS, call_rows_per_node, is_lossless
from specc.train.dtype import matmul_seconds, training_dtype
from specc.train.model_size import model_size

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
    # method config: `key=value` strings (the command line) or a dict of typed values (the API)
    settings: list[str] | dict = field(default_factory=list)
    kernels: bool = False   # attention through specc's Triton kernel (passes/use_kernels.py)
    show_progress: bool = False
    device: str = "auto"    # what the engine is for: training and ahead-of-time lowering run there
    quantize: str | None = None   # quantization of every source model's linears: specc.quantize.schemes.SCHEMES
    quantize_draft: str | None = None   # the extra source models' (a drafting model's) scheme instead of `quantize`
    teacher: str = "unquantized"   # what training distills from under `quantize`: specc.quantize.teacher.TEACHERS


def validate(request: CompileRequest):
    """Check everything cheap before any heavy work starts."""
    backend = get_backend(request.backend)
    backend.check_available()
    resolve_device(request.device)
    check_dtype(request.dtype)
    warn_emulated_bfloat16(request)
    for flag, name in (("--quantize", request.quantize), ("--quantize-draft", request.quantize_draft)):
        if name is not None:
            check_quantize(request, parse_scheme(name), flag)
    check_teacher(request)
    if not 8 <= request.max_seq_len <= 1 << 17:
        raise UsageError(f"--max-seq-len {request.max_seq_len} must be between 8 and 131072")
    method = get_method(request.method)
    check_backend(method, backend)
    config = (method.config_class.from_json(dict(request.settings)) if isinstance(request.settings, dict)
              else method.config_class.from_assignments(list(request.settings)))
    for source in method.extra_sources:
        if not getattr(config, source.config_field):
            raise UsageError(f"method {method.name!r} compiles a {source.name} checkpoint too; "
                             f"pass it with --set {source.config_field}=DIR")
    check_composition(config)
    check_draft_quantization(request, method, config)
    check_output_dir(request.output, request.force)
    checkpoint = resolve_checkpoint(request.model)
    if method.validate is not None or method.sized_defaults is not None:   # config.json: no weights load
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(checkpoint)
        config = sized_config(method, config, request.settings, model_config)
        if method.validate is not None:
            method.validate(config, model_config)
    return method, backend, config, checkpoint


def sized_config(method: MethodDescriptor, config, settings, model_config):
    """`config` with the defaults the method scales to this model (`MethodDescriptor.sized_defaults`)
    in place of its declared ones, for every field `settings` (the user's) leaves unset."""
    if method.sized_defaults is None:
        return config
    given = set(settings) if isinstance(settings, dict) else set(parse_assignments(list(settings)))
    sized = {name: value for name, value in method.sized_defaults(model_config).items()
             if name not in given and value != getattr(config, name)}
    if sized:
        log.warning("%s: %s, scaled to this model's size (%s; --set any of them to choose)", method.name,
                    ", ".join(f"{name}={value:g}" for name, value in sized.items()), model_size(model_config))
    return replace(config, **sized)


QUANTIZED_BACKENDS = ("eager", "inductor", "aoti")


def warn_emulated_bfloat16(request: CompileRequest) -> None:
    """A bfloat16 float engine for a CPU without bfloat16 units runs PyTorch's emulated matmuls."""
    if (request.dtype == "bfloat16" and request.quantize is None and request.backend in QUANTIZED_BACKENDS
            and resolve_device(request.device).type == "cpu" and emulates_bfloat16()):
        log.warning("--dtype bfloat16 without --quantize, on a CPU without bfloat16 units (AVX512-BF16, AMX): "
                    "PyTorch emulates bfloat16 matmuls here, so this engine decodes slower than in float32; "
                    "--quantize q4 runs bfloat16 activations on specc's own kernels (docs/quantization.md)")


def check_quantize(request: CompileRequest, scheme: Scheme, flag: str = "--quantize") -> None:
    """Quantized engines run the CPU's weight-only kernels on bfloat16 activations."""
    if request.dtype != "bfloat16":
        raise UsageError(f"{flag} {scheme.name} needs --dtype bfloat16: the quantized matmuls take bfloat16 "
                         f"activations, and bfloat16's fixed-row policy keeps speculation exact")
    if request.backend not in QUANTIZED_BACKENDS:
        raise UsageError(f"{flag} runs on the {', '.join(QUANTIZED_BACKENDS)} backends, not {request.backend}")
    if resolve_device(request.device).type != "cpu":
        raise UsageError(f"{flag} builds CPU engines (specc's and PyTorch's quantized kernels here are CPU "
                         "kernels); pass --device cpu")
    if scheme.kernel == BLOCKED and compiler() is None:
        raise UsageError(f"{flag} {scheme.name} runs specc's CPU kernel, compiled on first use: it needs a C++ "
                         f"compiler with OpenMP (install g++ or set CXX), or choose a weight-only scheme (int4, int8)")


def check_draft_quantization(request: CompileRequest, method, config) -> None:
    """`--quantize-draft` needs graphs that only draft, and a self-speculative method's draft
    graphs read the target's weights: packed two ways, they would share the packed names."""
    if request.quantize_draft is None:
        return
    recipes = method.graphs(config)
    if not any(recipe.drafts_only for recipe in recipes.values()):
        raise UsageError(f"--quantize-draft packs the weights of the graphs that only draft, and method "
                         f"{method.name!r} (as configured) has none: its draft runs inside the target's graphs")
    if (request.quantize is not None and reads_target_weights_to_draft(recipes)
            and parse_scheme(request.quantize) != parse_scheme(request.quantize_draft)):
        raise UsageError(f"--quantize-draft {request.quantize_draft} beside --quantize {request.quantize}: "
                         f"method {method.name!r} drafts with the target's own weights, which --quantize packs "
                         f"already; give one of them")


def check_teacher(request: CompileRequest) -> None:
    if request.teacher not in TEACHERS:
        raise UsageError(f"unknown --teacher {request.teacher!r}; choose from: {', '.join(TEACHERS)}")
    if request.teacher == "quantized" and request.quantize is None:
        raise UsageError("--teacher quantized distills from the model as --quantize packs it: pass --quantize too")


def compile_engine(request: CompileRequest) -> dict:
    start = time.perf_counter()
    method, backend, config, checkpoint = validate(request)
    device = resolve_device(request.device)
    progress = StageReporter(request.show_progress)
    with progress.stage("loading checkpoint"):
        models = _load_sources(method, config, checkpoint, request.dtype)
        tokenizer = load_tokenizer(checkpoint)
    captures: dict = {}
    method_state, trained_weights, training = {}, {}, None
    if request.teacher == "quantized" and method.train is None:
        log.warning("--teacher quantized changes nothing: %s does not train", method.name)
    if method.train is not None:
        trained, training = _train(method, config, request, checkpoint, models, captures, tokenizer, progress,
                                   device)
        config, method_state, trained_weights = trained.config or config, trained.state, trained.weights
    if method.prepare is not None:
        with progress.stage(f"preparing {method.name}'s data"):
            method_state = {**method_state, **method.prepare(config, tokenizer)}
    if lookup_corpus_requested(config):
        with progress.stage("tokenizing the lookup corpus"):
            method_state = {**method_state, **lookup_corpus_state(config, tokenizer)}
    quantization = engine_quantization(request, method, config, checkpoint)
    recipes = method.graphs(config)
    with progress.stage("capturing with torch.export and running passes"):
        program = build_program(models, method, config, request.max_seq_len, kernels=request.kernels,
                                captures=captures, state=method_state if method.train is not None else None,
                                recipes=recipes, select_logit_rows=True, quantize=quantization)
        program.added_weights = install_weights(program, trained_weights)
    reports = {}
    for key, (scheme, source, names) in _report_groups(recipes, quantization).items():
        model = "" if key == TARGET_REPORT else " (draft graphs)"
        with progress.stage(f"measuring what {scheme.name} costs on held-out text{model}"):
            reports[key] = quantization_report(program, scheme, names, models[source], tokenizer)
    exact = backend.exact_rows(getattr(torch, request.dtype))
    lossless = is_lossless(method, config, exact)
    if not lossless and is_lossless(method, config):
        log.warning("%s's verifying calls hold %d rows per draft node, and %s computes %s rows exactly in %s: "
                    "too few to verify a drafted token, so its tokens may differ from plain greedy decoding in "
                    "%s: the engine is marked lossy (compile in float32 for identity)", method.name,
                    call_rows_per_node(method, config), request.backend, exact, request.dtype, request.dtype)
    with staging_dir(request.output, request.force) as staging:
        with progress.stage("writing engine"):
            tables = write_program(staging, program, tokenizer)
        with progress.stage(f"lowering ({request.backend})", own_line=backend.ahead_of_time):
            lowering_seconds, lowered = _lower_ahead_of_time(staging, program, backend, request, device,
                                                             progress.enabled)
        kernels = _kernels_by_graph(program)
        report = {
            "method": method.name, "method_config": config.to_json(), "backend": request.backend,
            "dtype": request.dtype, "max_seq_len": request.max_seq_len, "lossless": lossless,
            "device": device_kind(device),
            "source_checkpoint": str(checkpoint),
            "passes": [r.to_json() for r in program.pass_records],
            **({"method_state": method_state} if method_state else {}),
            **({"lowered": lowered} if lowered else {}),
            **reports,
            **({"kernels": kernels,
                "kernel_revisions": kernel_revisions(set().union(*kernels.values()))} if kernels else {}),
            "compile_seconds": {"total": round(time.perf_counter() - start, 3),
                                "lowering": round(lowering_seconds, 3), "stages": progress.seconds},
            **({"training": training} if training else {}),
            **tables,
        }
        write_manifest(staging, report)
    return report


def _train(method, config, request: CompileRequest, checkpoint, models: dict, captures: dict, tokenizer,
           progress: StageReporter, engine_device: torch.device):
    """The method's training step on programs of its own, on the engine's device (the CPU for a
    method that does not train on device), in the dtype `training_dtype` picks there (the
    engine's models and captures are reused when it is the engine's); its result and a report
    (seconds, dtype, device and, for reduced-precision engines, the probe's timings)."""
    device = engine_device if method.trains_on_device else torch.device("cpu")
    hidden = models[TARGET].config.hidden_size
    train_dtype = training_dtype(request.dtype, hidden, device)
    quantized_teacher = request.teacher == "quantized"
    if train_dtype == request.dtype and not quantized_teacher:
        train_models, train_captures = models, captures
    else:
        with progress.stage(f"loading a {train_dtype} copy to train in"):
            train_models, train_captures = _load_sources(method, config, checkpoint, train_dtype), {}
    if quantized_teacher:
        with progress.stage(f"rounding the teacher's weights through {request.quantize}"):
            for source, scheme in engine_quantization(request, method, config, checkpoint).by_source.items():
                round_linear_weights(train_models[source], scheme, getattr(torch, request.dtype))
    with progress.stage(f"capturing with torch.export and running passes ({train_dtype}, for training)"):
        context = training_context(train_models, method, config, request.max_seq_len, kernels=request.kernels,
                                   captures=train_captures, device=device, engine_backend=request.backend,
                                   engine_device=engine_device)
    start = time.perf_counter()
    with progress.stage(f"training/calibrating {method.name}", own_line=True):
        trained = method.train(context, config, tokenizer)
    report = {"seconds": round(time.perf_counter() - start, 3), "dtype": train_dtype, "device": str(device),
              **({"teacher": f"{request.quantize} weights"} if quantized_teacher else {})}
    if request.dtype != "float32":
        probe = matmul_seconds((request.dtype, "float32"), hidden, device)
        report["matmul_ms"] = {name: round(seconds * 1e3, 4) for name, seconds in probe.items()}
    return trained, report


def engine_quantization(request: CompileRequest, method, config, checkpoint) -> Quantization:
    """The schemes of the engine's graphs: `--quantize` for every source model,
    `--quantize-draft` instead for an extra (draft) model and for the target's graphs that
    only draft; each LM head at the bits its own checkpoint's GGUF allows (`head_bits_for`).
    What neither names stays in `--dtype`."""
    def scheme(name: str, source_checkpoint) -> Scheme:
        return head_bits_for(parse_scheme(name), converted_head_type(source_checkpoint))

    by_source = {TARGET: scheme(request.quantize, checkpoint)} if request.quantize else {}
    for source in method.extra_sources:
        name = request.quantize_draft or request.quantize
        if name:
            by_source[source.name] = scheme(name, resolve_checkpoint(getattr(config, source.config_field)))
    drafts = scheme(request.quantize_draft, checkpoint) if request.quantize_draft else None
    return Quantization(by_source, drafts)


def _report_groups(recipes: dict[str, GraphRecipe], quantization: Quantization) -> dict[str, tuple]:
    """Manifest key -> (scheme, the source model its quality is measured on, graph names)."""
    groups: dict[str, tuple] = {}
    for name, recipe in recipes.items():
        scheme = quantization.for_graph(recipe)
        if scheme is not None:
            key = quantization.report_key(recipe)
            groups.setdefault(key, (scheme, recipe.source, []))[2].append(name)
    return groups


def _load_sources(method, config, checkpoint, dtype: str) -> dict:
    """The target and every extra source model of `method`, loaded in `dtype`."""
    models = {TARGET: load_model(checkpoint, dtype)}
    for source in method.extra_sources:
        models[source.name] = load_model(resolve_checkpoint(getattr(config, source.config_field)), dtype)
        if source.same_vocabulary:
            _check_same_vocabulary(source.name, models[TARGET], models[source.name])
    return models


def build_program(models: dict, method, config, max_seq_len: int, kernels: bool = False,
                  captures: dict | None = None, state: dict | None = None,
                  recipes: dict[str, GraphRecipe] | None = None, select_logit_rows: bool = False,
                  quantize: Quantization | None = None) -> SpeculativeProgram:
    """Capture each source model once (into `captures`, reused across calls); every named graph
    (the method's for `config`, or `recipes`) rewrites its own copy of the capture with its
    recipe's passes, then, given the method `state` training produced, its `after_training`
    passes, then, for an engine (`select_logit_rows`), `select_logit_rows` (logits computed
    only for the rows a call asks for), then, for a graph `quantize` gives a scheme,
    `quantize_linear_weights` (its captured model's own linear weights, packed once per scheme
    for the whole program) and the attention
    rewrites that let its rows run unpadded, and last, with
    `kernels`, `use_kernels` (attention through specc's kernel). Every pass is recorded."""
    program = SpeculativeProgram()
    captures = {} if captures is None else captures
    packed: dict = {}
    recipes = method.graphs(config) if recipes is None else recipes
    for name, recipe in recipes.items():
        if recipe.source not in models:
            raise UsageError(f"method {method.name!r} needs a {recipe.source!r} model")
        if recipe.source not in captures:
            captured = capture(models[recipe.source], max_seq_len)
            captures[recipe.source] = (captured, readable_graph(captured.graph_module))
        captured, captured_text = captures[recipe.source]
        later = recipe.after_training(config, state) if state is not None and recipe.after_training else []
        scheme = quantize.for_graph(recipe) if quantize is not None else None
        passes = [*recipe.passes(config), *later, *([SelectLogitRows()] if select_logit_rows else []),
                  *([_quantizer(scheme, captured, packed.setdefault(scheme, {})),
                     *_row_alike_attention(scheme, packed.setdefault((scheme, "layers"), {}))]
                    if scheme else []),
                  *([UseKernels()] if kernels else [])]
        gm, records = run_passes(name, graph_copy(captured.graph_module), passes)
        program.graphs[name] = ProgramGraph(name, recipe.source, gm, captured.architecture, captured_text,
                                            lowered=recipe.lowered)
        program.pass_records += records
    return program


def _row_alike_attention(scheme: Scheme, layers: dict) -> list:
    """Under specc's blocked kernels attention runs row by row through specc's CPU library (which
    those kernels need anyway) and each decoder layer's chain after it as one call of that
    library (its weights packed once, into `layers`, for the program's graphs), consecutive layers
    as one call; PyTorch's
    attention, padded, takes what that leaves."""
    blocked = ([UseRowAttention(EXACT_ROWS), FuseDecoderChain(store=layers), StackDecoderLayers()]
               if scheme.kernel == BLOCKED else [])
    return [*blocked, PadAttentionRows(EXACT_ROWS)]


def _quantizer(scheme: Scheme, captured, packed: dict) -> QuantizeLinearWeights:
    """The pass quantizing the weights the `captured` model holds (never a method's added ones);
    a weight with a row per vocabulary entry computes logits."""
    module, vocab = captured.graph_module, captured.architecture.vocab_size
    frozen = {t.data_ptr() for t in [*module.parameters(), *module.buffers()]}
    return QuantizeLinearWeights(scheme, quantizable=lambda tensor: tensor.data_ptr() in frozen, store=packed,
                                 computes_logits=lambda tensor: tensor.shape[0] == vocab)


def training_context(models: dict, method, config, max_seq_len: int, kernels: bool = False,
                     captures: dict | None = None, device: torch.device = torch.device("cpu"),
                     engine_backend: str = "eager", engine_device: torch.device | None = None) -> TrainingContext:
    """What `method.train` works on: the method's program for `config` and a builder of more
    graphs, all by `build_program` from `models` (captured once, into `captures`), on `device`;
    and what the engine will be lowered for (`engine_device` defaults to `device`)."""
    captures = {} if captures is None else captures

    def build(recipes: dict[str, GraphRecipe], config, state: dict | None) -> SpeculativeProgram:
        program = build_program(models, method, config, max_seq_len, kernels=kernels, captures=captures,
                                state=state, recipes=recipes)
        for graph in program.graphs.values():
            move_graph(graph.module, device)
        return program

    return TrainingContext(build(method.graphs(config), config, None), method, build, engine_backend,
                           device if engine_device is None else engine_device)


def install_weights(program: SpeculativeProgram, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy trained `weights` into every graph of `program` that holds a tensor of that name, in
    that tensor's dtype; returns them as installed (the engine's added weights). A frozen copy
    a pass made (a reduced draft head, `FROZEN_COPIES`) that `--quantize` packed has nothing to
    install: its rows are the model's own, copied when the graph was built."""
    installed = {}
    copies = set().union(*(graph.module.meta.get(FROZEN_COPIES, set()) for graph in program.graphs.values()))
    for name, value in weights.items():
        holders = [graph.module for graph in program.graphs.values() if _has_tensor(graph.module, name)]
        if not holders and name in copies:
            continue
        if not holders:
            raise SpeccError(f"training produced {name!r}, which no graph of the program reads")
        with torch.no_grad():
            for module in holders:
                tensor = attribute(module, name)
                if tensor.shape != value.shape:
                    raise SpeccError(f"trained {name!r} has shape {tuple(value.shape)}, the graph's "
                                     f"{tuple(tensor.shape)}")
                tensor.copy_(value)
        installed[name] = attribute(holders[0], name).detach().clone()
    return installed


def _has_tensor(module: torch.nn.Module, name: str) -> bool:
    try:
        return isinstance(attribute(module, name), torch.Tensor)
    except AttributeError:
        return False


def _lower_ahead_of_time(staging: Path, program: SpeculativeProgram, backend, request: CompileRequest,
                         device: torch.device, show_progress: bool = False) -> tuple[float, dict]:
    """Seconds spent, and per graph: its seconds and the sizes of the files it wrote (built on
    `device`: packages for CUDA are built with the graphs on the GPU). A graph can take minutes
    (a SmolLM2 AOTInductor package, say), so a bar names the graph being lowered and its clock
    runs, and a line per graph says what it wrote."""
    if not backend.ahead_of_time:
        return 0.0, {}
    start = time.perf_counter()
    (staging / "compiled").mkdir()
    dtype = getattr(torch, request.dtype)
    lowered = {}
    whole = {name: graph for name, graph in program.graphs.items() if graph.lowered}
    bar = progress_bar(total=len(whole), desc=f"{backend.name}: lowering", unit="graph",
               leave=False, disable=not show_progress)
    with bar, ticking(bar):
        for name, graph in whole.items():
            log.info("lowering %s with %s on %s", name, backend.name, device)
            bar.set_description(f"{backend.name}: lowering graph {name!r}")
            target = LoweringTarget(name, move_graph(graph.module, device), read_signature(graph.module),
                                    static_sizes(graph.architecture, request.max_seq_len), dtype,
                                    request.max_seq_len, device)
            graph_start = time.perf_counter()
            files = backend.package(target, staging / "compiled")
            lowered[name] = {"seconds": round(time.perf_counter() - graph_start, 3),
                             "files": {f: (staging / "compiled" / f).stat().st_size for f in files or []}}
            if show_progress:
                bar.write(_lowered_line(name, lowered[name]), file=sys.stderr)
            bar.update()
    return time.perf_counter() - start, lowered


def _lowered_line(name: str, lowered: dict) -> str:
    files = ", ".join(f"{file} ({size / 1e6:.1f} MB)" for file, size in lowered["files"].items())
    return f"    graph {name!r}: {files or 'no files'} in {lowered['seconds']:.1f}s"


def _kernels_by_graph(program: SpeculativeProgram) -> dict[str, list[str]]:
    """The specc kernels each graph calls (graphs that call none are left out)."""
    used = {name: kernels_in_graph(graph.module) for name, graph in program.graphs.items()}
    return {name: kernels for name, kernels in used.items() if kernels}


def _check_same_vocabulary(name: str, target, other) -> None:
    if target.config.vocab_size != other.config.vocab_size:
        raise UsageError(
            f"the {name} model's vocabulary ({other.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size}); pass a {name} checkpoint that shares the target's tokenizer"
        )
