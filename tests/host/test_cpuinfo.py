"""/proc/cpuinfo read once, for the kernels' build key and tuning, the thread default, training's precision and bench's machine."""

from __future__ import annotations

import pytest

from specc.host import cpuinfo, threads

# Two cores with two hyper-threads each: four processors, the fields repeated for each.
FOUR_PROCESSORS = "\n".join(
    f"processor\t: {i}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC 9B14\n"
    f"physical id\t: 0\ncore id\t\t: {i // 2}\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    for i in range(4)
)


@pytest.fixture
def cpuinfo_file(tmp_path, monkeypatch):
    """Points the reader at a file of the test's choosing (or none), its cache cleared before and after."""
    def use(text: str | None):
        path = tmp_path / "cpuinfo"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        monkeypatch.setattr(cpuinfo, "CPUINFO", path)
        cpuinfo.cpuinfo_text.cache_clear()
    yield use
    cpuinfo.cpuinfo_text.cache_clear()


def test_the_first_processor_s_fields_and_flags(cpuinfo_file):
    cpuinfo_file(FOUR_PROCESSORS)
    assert cpuinfo.cpu_fields()["cpu family"] == "25"
    assert cpuinfo.cpu_model() == "AMD EPYC 9B14"
    assert cpuinfo.cpu_flags() == {"fpu", "avx2", "avx512f", "avx512_bf16"}


def test_hyper_threads_of_one_core_count_once(cpuinfo_file, monkeypatch):
    cpuinfo_file(FOUR_PROCESSORS)
    assert cpuinfo.physical_core_ids(FOUR_PROCESSORS) == {("0", "0"), ("0", "1")}
    assert threads.physical_cores() == 2


def test_without_the_file_every_reader_says_nothing(cpuinfo_file, monkeypatch):
    cpuinfo_file(None)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 3)
    assert cpuinfo.cpuinfo_text() is None
    assert cpuinfo.cpu_fields() == {} and cpuinfo.cpu_model() is None and cpuinfo.cpu_flags() == frozenset()
    assert threads.physical_cores() == 3


def test_a_listing_without_core_ids_falls_back_to_the_processor_count(cpuinfo_file, monkeypatch):
    cpuinfo_file("processor\t: 0\nflags\t\t: fpu\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    assert threads.physical_cores() == 2


def test_bfloat16_units_and_their_emulation_on_x86(cpuinfo_file, monkeypatch):
    monkeypatch.setattr(cpuinfo.platform, "machine", lambda: "x86_64")
    cpuinfo_file(FOUR_PROCESSORS)
    assert cpuinfo.has_bfloat16_units() and not cpuinfo.emulates_bfloat16()
    cpuinfo_file(FOUR_PROCESSORS.replace(" avx512_bf16", ""))
    assert not cpuinfo.has_bfloat16_units() and cpuinfo.emulates_bfloat16()
    cpuinfo_file(None)
    assert not cpuinfo.emulates_bfloat16()   # nothing known: no claim
    monkeypatch.setattr(cpuinfo.platform, "machine", lambda: "aarch64")
    cpuinfo_file(FOUR_PROCESSORS.replace(" avx512_bf16", ""))
    assert not cpuinfo.emulates_bfloat16()   # other architectures name their units otherwise
