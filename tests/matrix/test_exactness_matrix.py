"""The exactness matrix (`specc.testing.exactness_matrix`): lossless engines on quirky tiny checkpoints
are token-identical to Hugging Face greedy in float32 and to the bfloat16 `none` engine in
bfloat16, or refused at compile time with a reason.

Fast by default: every method on every quirky model in eager (Mistral's sliding window, the quirk
that broke SpecEE, and the two that interleave sliding-window and full layers, Gemma 3 and Qwen2
with max_window_layers, among them) and draft-model's chain variant too, `none` on every family
under onnx, and under inductor `none` and the methods that run there spread over the quirky
models so that each runs at least once (`FAST_INDUCTOR`),
every method with q4 weights (`--quantize q4`, specc's kernel) in bfloat16 on one family against
its quantized `none`, every method with graphs that only draft with those graphs in q4 and the
target in bfloat16 (`--quantize-draft q4`) against the bfloat16 `none`, and every method whose drafter composes with the n-gram branch (`lookup=true`) in
float32 and bfloat16. `-m slow` runs the whole matrix: every method × family × backend in float32, every
method × backend in bfloat16 on one family, and the quantized column with q4, int4 and int8
weights under eager, inductor and aoti. `benchmarks/matrix.py` prints it as a table.
"""

from __future__ import annotations

import pytest

from specc.contract.sampling import SamplingConfig
from specc.testing.exactness_matrix import (BACKENDS, COMPOSABLE, MAX_NEW_TOKENS, METHODS, VARIANTS, Cell, QuirkyCheckpoints,
                                            cell_engine, prompts, run_cell)
from specc.testing.checkpoints import QUIRKY_MODELS

BFLOAT16_FAMILY = "llama"
# Engines compiled lossy on purpose, as (method, dtype, variant): FIRP's verifier reads k pseudo rows
# per node past the draft's, and with k = 3 a drafted token's call holds more rows than bfloat16
# backends compute exactly (the compiler warns and the manifest says lossless: false); its k = 1
# variant fits and stays lossless.
LOSSY = {("firp", "bfloat16", "")}
# Variants whose point is bfloat16 (`VARIANTS`), run in bfloat16 on one family, plain and with q4.
BFLOAT16_VARIANTS = (("firp", "k1"),)
# Refusals the matrix expects, each with the words its reason must contain.
REFUSALS = {
    ("onnx", "bfloat16"): "no bfloat16 kernels on the CPU",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, prompt_lookup_method):
    """(checkpoints, workdir, reference cache, engines by cell), shared by the module's tests."""
    return QuirkyCheckpoints(tmp_path_factory.mktemp("quirky")), tmp_path_factory.mktemp("cells"), {}, {}


@pytest.fixture(scope="module")
def matrix(built):
    checkpoints, workdir, cache, engines = built
    return lambda cell: run_cell(cell, checkpoints, workdir, cache, engines)


@pytest.fixture(scope="module")
def engine_of(built):
    checkpoints, workdir, _, engines = built
    return lambda cell: cell_engine(cell, checkpoints, workdir, engines)


def assert_exact(result) -> None:
    expected_refusal = REFUSALS.get((result.cell.backend, result.cell.dtype))
    if expected_refusal is not None:
        assert result.status == "refused" and expected_refusal in result.detail, result.mark()
        return
    if (result.cell.method, result.cell.dtype, result.cell.variant) in LOSSY:
        assert result.status == "lossy", f"{result.cell.label}: {result.mark()}"
        return
    assert result.status == "identical", f"{result.cell.label}: {result.mark()}"
    if result.cell.method != "none":   # identical without speculation would prove nothing
        assert 0 < result.accepted < result.drafted, f"{result.cell.label}: {result.mark()}"
        assert result.forward_passes < result.new_tokens, f"{result.cell.label}: no target pass saved"
    else:   # one token per target pass
        assert result.drafted == 0 and result.forward_passes == result.new_tokens, result.cell.label


# The quantized column (`--quantize`): q4 (specc's kernel), whose blocks of 32 inputs and tiles
# of 16 outputs the tiny checkpoints' widths divide, so every linear but the LM head (q6) takes
# it; PyTorch's int4 and int8 kernels and the compiled backends run with -m slow.
QUANTIZED = "q4"
QUANTIZED_BACKENDS = ("eager", "inductor", "aoti")
# Methods with graphs that only draft (`GraphRecipe.drafts_only`), which `--quantize-draft` packs.
DRAFT_GRAPHS = ("draft-model", "kangaroo", "swift", "s3d", "specee", "eagle")
# The fast selection's inductor cells (each compiles for a minute or more on a 2-core CPU): `none`
# on a plain family and on both that interleave windowed and full layers, and methods spread so
# that every quirky model runs under inductor at least once; -m slow runs every cell.
FAST_INDUCTOR = {"none": ("llama", "gemma3_text", "qwen2_interleaved"), "draft-model": ("mistral", "qwen2"),
                 "kangaroo": ("qwen3", "gemma3_text"), "eagle": ("phi3",), "firp": ("llama",), "s3d": ("llama",)}


def fast_cells() -> list[Cell]:
    methods = [Cell(m, f, "eager") for m in METHODS for f in QUIRKY_MODELS]
    variants = [Cell(m, f, "eager", variant=v) for m in VARIANTS for v in VARIANTS[m] for f in QUIRKY_MODELS]
    backends = [Cell("none", f, "onnx") for f in QUIRKY_MODELS]
    backends += [Cell(m, f, "inductor") for m, families in FAST_INDUCTOR.items() for f in families]
    quantized = [Cell(m, BFLOAT16_FAMILY, "eager", "bfloat16", QUANTIZED) for m in METHODS if m != "none"]
    quantized += [Cell(m, BFLOAT16_FAMILY, "eager", "bfloat16", quantize_draft=QUANTIZED) for m in DRAFT_GRAPHS]
    composed = [Cell(m, f, "eager", dtype, lookup=True) for m in COMPOSABLE
                for f, dtype in (("mistral", "float32"), (BFLOAT16_FAMILY, "bfloat16"))]
    reduced = [Cell(m, BFLOAT16_FAMILY, "eager", "bfloat16", scheme, variant=v) for m, v in BFLOAT16_VARIANTS
               for scheme in (None, QUANTIZED)]
    return methods + variants + backends + quantized + composed + reduced


def slow_cells() -> list[Cell]:
    fast = set(fast_cells())
    float32 = [Cell(m, f, b) for b in BACKENDS for m in METHODS for f in QUIRKY_MODELS]
    bfloat16 = [Cell(m, BFLOAT16_FAMILY, b, "bfloat16") for b in BACKENDS for m in METHODS if m != "none"]
    quantized = [Cell(m, BFLOAT16_FAMILY, b, "bfloat16", scheme) for scheme in (QUANTIZED, "int4-g32", "int8")
                 for b in QUANTIZED_BACKENDS for m in METHODS if m != "none"]
    reduced = [Cell(m, BFLOAT16_FAMILY, b, "bfloat16", variant=v) for m, v in BFLOAT16_VARIANTS for b in BACKENDS]
    return [c for c in float32 + bfloat16 + quantized + reduced if c not in fast]


@pytest.mark.parametrize("cell", fast_cells(), ids=lambda c: c.label)
def test_fast_cell(matrix, engine_of, cell):
    assert_exact(matrix(cell))
    if cell.backend == "inductor":
        assert engine_of(cell).compile_seconds > 0


@pytest.mark.slow
@pytest.mark.parametrize("cell", slow_cells(), ids=lambda c: c.label)
def test_slow_cell(matrix, cell):
    assert_exact(matrix(cell))


def test_the_matrix_covers_every_registered_lossless_method(prompt_lookup_method):
    """The conformance suite (the cells above and the tests below, with
    tests/matrix/test_sampling_matrix.py) is parametrised over every lossless method there is
    (tests/matrix/test_training_conformance.py, over every method that trains)."""
    from specc.contract.descriptor import all_methods

    registered = {m.name for m in all_methods() if m.lossless or m.lossless_when is not None}
    assert registered == set(METHODS)


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_turns_after_a_reused_prefix_match_hf_greedy(built, engine_of, method, family):
    """A conversation whose every turn after the first prefills only what the last one did not
    feed the target gives HF greedy's tokens, turn after turn, for every method."""
    from specc.testing.checkpoints import assert_turns_reusing_match_hf_greedy

    engine = engine_of(Cell(method, family, "eager"))
    target = built[0](family)[0]
    reused = assert_turns_reusing_match_hf_greedy(engine, target, prompts()[4] + [7, 9, 11], MAX_NEW_TOKENS)
    assert reused[0] == 0 and reused[-1] > reused[1] > 0


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
@pytest.mark.parametrize("method", METHODS)
def test_a_seeded_sample_after_a_reused_prefix_is_the_one_without_reuse(engine_of, method, family):
    """Same seed and prompt, same tokens and drafts, whatever the engine ran before: a chat
    turn reusing the cache of a greedy turn samples what a fresh engine samples (with one
    window for every layer, and with windowed layers among full ones)."""
    engine = engine_of(Cell(method, family, "eager"))
    sampling = SamplingConfig(temperature=0.8, seed=7)
    for first in prompts()[:3]:
        reply = engine.generate_ids(first, MAX_NEW_TOKENS, reuse_prefix=True).token_ids
        turn = first + reply + first[:3]
        reusing = engine.generate_ids(turn, MAX_NEW_TOKENS, sampling, reuse_prefix=True)
        fresh = engine.generate_ids(turn, MAX_NEW_TOKENS, sampling)
        assert reusing.stats.reused_prompt_tokens == (len(first) + len(reply) - 1 if engine.reuses_prefixes else 0)
        assert fresh.stats.reused_prompt_tokens == 0
        assert reusing.token_ids == fresh.token_ids, f"{method}: prompt {turn}"
        assert (reusing.stats.drafted_tokens, reusing.stats.target_forward_passes) == \
            (fresh.stats.drafted_tokens, fresh.stats.target_forward_passes), f"{method}: the same rounds"


def test_the_composed_column_covers_every_method_whose_drafter_composes(prompt_lookup_method):
    from specc.contract.descriptor import get_method
    from specc.contract.options import CompositionOptions

    composes = {m for m in METHODS if issubclass(get_method(m).config_class, CompositionOptions)}
    assert composes == set(COMPOSABLE)


def test_a_checkpoint_mixing_full_and_sliding_layers_windows_its_layers_in_the_graph():
    from specc.capture.families import layer_windows, summarize_architecture
    from specc.testing.checkpoints import quirky_config

    mixed = quirky_config("qwen2", max_window_layers=1)
    assert summarize_architecture(mixed).sliding_window is None, "the runtime's one mask is the full one"
    assert layer_windows(mixed) == (None, 6, 6)
    assert layer_windows(quirky_config("gemma3_text")) == (5, None, 5)
    assert summarize_architecture(quirky_config("qwen2")).sliding_window == 6
    assert layer_windows(quirky_config("qwen2")) is None
    # A window no layer uses (every layer below max_window_layers attends fully) is no window.
    assert summarize_architecture(quirky_config("qwen2", max_window_layers=3)).sliding_window is None
    assert summarize_architecture(quirky_config("mistral")).sliding_window == 6


def test_the_draft_quantized_column_covers_every_method_with_graphs_that_only_draft(prompt_lookup_method):
    from specc.contract.descriptor import get_method

    drafts = {m for m in METHODS
              if any(r.drafts_only for r in get_method(m).graphs(get_method(m).config_class()).values())}
    assert drafts == set(DRAFT_GRAPHS)


def test_the_fast_inductor_cells_run_every_quirky_model():
    assert {f for families in FAST_INDUCTOR.values() for f in families} == set(QUIRKY_MODELS)
