"""specc.blocked_matmul, the CPU kernel of `--quantize q4|q6|q8`: its layout round-trips, it computes
its reference's arithmetic, and each row's result is the same bits whatever else the call holds."""

from __future__ import annotations

import pytest
import torch

from specc.kernels import blocked_matmul as blocked
from specc.kernels.cpu import build
from specc.host.threads import torch_threads

OUT, IN = 96, 160   # six tiles of 16 outputs, five blocks of 32 inputs: one short group
LONG_IN = 608       # 19 blocks: two groups of 8 and a short one
BITS_AND_INPUTS = [(bits, inputs) for bits in blocked.BITS for inputs in (IN, LONG_IN)]


def _weight(seed: int = 0, inputs: int = IN) -> torch.Tensor:
    return torch.randn(OUT, inputs, generator=torch.Generator().manual_seed(seed)) * 0.05


def _rows(count: int, seed: int = 1, inputs: int = IN) -> torch.Tensor:
    return torch.randn(count, inputs, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("bits, inputs", BITS_AND_INPUTS)
def test_unpacking_gives_back_each_weight_within_half_a_step_of_its_block(bits, inputs):
    weight = _weight(inputs=inputs)
    q, scales, mins = blocked.unpack_blocked(blocked.pack_blocked(weight, bits), bits, OUT)
    dequantized = (q.float() * scales.float()[..., None] + mins.float()[..., None]).reshape(OUT, inputs)
    step = scales.float().repeat_interleave(blocked.BLOCK, dim=1)
    assert q.max() <= (1 << bits) - 1
    half_min_step = weight.abs().amax() / (2 * blocked.SUB_MINS)   # mins round to their nearest sub-min
    assert torch.all((dequantized - weight).abs() <= step / 2 + half_min_step + 1e-6)


def test_a_weight_takes_its_bits_plus_five_eighths_of_a_bit_in_whole_groups():
    for bits in blocked.BITS:
        packed = blocked.pack_blocked(_weight(inputs=512), bits)
        assert packed.shape == (OUT // blocked.TILE, blocked.tile_bytes(512, bits))
        assert packed.numel() * 8 / (OUT * 512) == bits + 0.625
        assert blocked.inputs_of(packed, bits) == 512


@pytest.mark.parametrize("bits, inputs", BITS_AND_INPUTS)
def test_the_kernel_computes_its_reference(bits, inputs):
    packed, rows = blocked.pack_blocked(_weight(inputs=inputs), bits), _rows(7, inputs=inputs)
    got = torch.ops.specc.blocked_matmul(rows, packed, bits, OUT).float()
    want = blocked.reference(rows, packed, bits, OUT)
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-2 * want.abs().amax().item())


@pytest.mark.parametrize("bits", blocked.BITS)
def test_a_row_is_the_same_bits_in_calls_of_any_size_and_thread_count(bits):
    packed, rows = blocked.pack_blocked(_weight(), bits), _rows(11)
    with torch_threads(2):
        together = torch.ops.specc.blocked_matmul(rows, packed, bits, OUT)
    with torch_threads(1):
        for count in (1, 2, 3, 5):
            assert torch.equal(torch.ops.specc.blocked_matmul(rows[-count:], packed, bits, OUT), together[-count:])


@pytest.mark.parametrize("bits, inputs", BITS_AND_INPUTS)
def test_the_portable_path_computes_the_same_bits_as_the_vector_one(bits, inputs):
    packed, rows = blocked.pack_blocked(_weight(inputs=inputs), bits), _rows(6, inputs=inputs)
    assert torch.equal(blocked.scalar_blocked_matmul(rows, packed, bits, OUT),
                       torch.ops.specc.blocked_matmul(rows, packed, bits, OUT))


def test_the_portable_path_quantizes_activations_as_the_vector_one():
    """Halfway cases (a block whose scale is 1 holding k + 0.5), an all-zero block and tiny and
    huge blocks: the vector quantizer rounds each like the scalar one (to nearest even)."""
    ties = torch.tensor([127.0] + [sign * (k + 0.5) for k in range(15) for sign in (1, -1)] + [0.5])
    rows = _rows(2)
    rows[0, :blocked.BLOCK] = ties
    rows[0, blocked.BLOCK:2 * blocked.BLOCK] = 0
    rows[1, :blocked.BLOCK] *= 1e-30
    rows[1, blocked.BLOCK:2 * blocked.BLOCK] *= 1e30
    for bits in blocked.BITS:
        packed = blocked.pack_blocked(_weight(), bits)
        assert torch.equal(blocked.scalar_blocked_matmul(rows, packed, bits, OUT),
                           torch.ops.specc.blocked_matmul(rows, packed, bits, OUT))


def test_zero_rows_and_a_zero_block_are_computed():
    packed = blocked.pack_blocked(_weight(), 4)
    assert torch.ops.specc.blocked_matmul(_rows(0), packed, 4, OUT).shape == (0, OUT)
    rows = _rows(2)
    rows[:, :blocked.BLOCK] = 0   # an all-zero activation block has scale 0
    assert torch.isfinite(torch.ops.specc.blocked_matmul(rows, packed, 4, OUT).float()).all()


@pytest.mark.parametrize("call, words", [
    (lambda p: torch.ops.specc.blocked_matmul(_rows(2).float(), p, 4, OUT), "bfloat16 rows"),
    (lambda p: torch.ops.specc.blocked_matmul(_rows(2), p, 5, OUT), "4, 6 or 8 bits"),
    (lambda p: torch.ops.specc.blocked_matmul(_rows(2), p, 4, OUT + 16), "does not map"),
    (lambda p: torch.ops.specc.blocked_matmul(_rows(2)[:, :128], p, 4, OUT), "does not map"),
])
def test_wrong_arguments_are_refused_with_what_was_given(call, words):
    with pytest.raises(ValueError, match=words):
        call(blocked.pack_blocked(_weight(), 4))


def test_a_weight_in_the_earlier_layout_is_refused_with_what_to_do():
    earlier = torch.zeros(OUT // blocked.TILE, IN // blocked.BLOCK, 4 * blocked.TILE + blocked.TILE * blocked.BLOCK // 2,
                          dtype=torch.uint8)
    with pytest.raises(ValueError, match="recompile the engine"):
        torch.ops.specc.blocked_matmul(_rows(2), earlier, 4, OUT)


def test_the_kernel_only_takes_shapes_its_tiles_fit():
    assert blocked.fits((1536, 8960)) and blocked.fits((256, 1536))
    assert not blocked.fits((40, 64)) and not blocked.fits((64, 48))


def test_a_build_is_keyed_by_its_source_and_a_missing_compiler_is_named(monkeypatch, tmp_path):
    cxx = build.compiler()
    assert cxx is not None, "the test machine builds the kernel"
    shipped = build.library_path("blocked_matmul", cxx)
    monkeypatch.setattr(build, "SOURCES", tmp_path)
    (tmp_path / "blocked_matmul.cpp").write_text("// another source\n")
    assert build.library_path("blocked_matmul", cxx) != shipped
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build.compiler() is None


def test_a_source_that_does_not_compile_fails_with_the_compiler_output(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "SOURCES", tmp_path)
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    with pytest.raises(build.KernelBuildError, match="compiling specc's CPU kernel broken.cpp"):
        build.load_library("broken")
    assert not list((tmp_path / "cache").rglob("*.so")), "nothing half-written is left"


def _cpuinfo(vendor: str, family: int, flags: str) -> str:
    processor = f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: fpu sse2 avx2 {flags}\n"
    return processor + "\n" + processor   # /proc/cpuinfo repeats itself for each processor


def test_the_cpu_chooses_which_tiles_request_their_weights_and_into_which_cache():
    zen4 = build.tuning_flags(_cpuinfo("AuthenticAMD", 25, "avx512f avx512bw avx512_vnni"))
    assert zen4 == (f"-DSPECC_BLOCK_REQUESTS={1 << 6}",)   # the 6-bit tiles keep theirs
    assert build.tuning_flags(_cpuinfo("AuthenticAMD", 25, "fma f16c")) == ()            # Zen 3
    assert build.tuning_flags(_cpuinfo("AuthenticAMD", 26, "avx512f avx512bw")) == ()    # Zen 5
    intel = ("-DSPECC_PREFETCH_HINT=_MM_HINT_T1", "-DSPECC_PREFETCH_BYTES=4096")   # into L2, not non-temporal
    assert build.tuning_flags(_cpuinfo("GenuineIntel", 6, "avx512f avx512bw")) == intel
    assert build.tuning_flags("") == ()
