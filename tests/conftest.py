"""Shared fixtures: seeded tiny checkpoints of every family, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

# specc's Triton kernels are tested in Triton's interpreter (no GPU here). Triton reads the
# variable when it is first imported, and other tests import it too (Inductor does), so it is
# set for the whole session, before anything imports triton; CPU-side Inductor ignores it.
# (Importing torch does not import triton.)
import torch

if not torch.cuda.is_available():   # on a GPU, Inductor's Triton kernels (and specc's) run compiled
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from specc.testing.checkpoints import build_tiny_checkpoint, set_eos_to_a_generated_token, varied_prompts

# The test models are tiny: intra-op threads only add overhead, and they
# thrash badly when several test processes share the two cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """family -> (target dir, draft dir). The draft is a noisy copy of the
    target, so rounds accept some tokens and reject others."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            target = build_tiny_checkpoint(family, root / "target", seed=0)
            set_eos_to_a_generated_token(target, varied_prompts(12, 96, seed=7), 24)
            draft = build_tiny_checkpoint(family, root / "draft", seed=0, noise_from=target, noise=0.08)
            cache[family] = (target, draft)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def wide_checkpoint(tmp_path_factory) -> Path:
    """A random llama at SmolLM2-135M's widths (4 layers): wide enough that bfloat16 kernels
    round a row differently in calls of different row counts, which the tiny models are not."""
    return build_tiny_checkpoint("llama", tmp_path_factory.mktemp("wide") / "target", hidden_size=576,
                                 intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                                 num_hidden_layers=4, vocab_size=49152)


@pytest.fixture(scope="session")
def prompt_lookup_method():
    """The example method of examples/prompt_lookup registered in-process (its entry point is tested
    separately, in tests/examples)."""
    import sys

    from specc.contract import descriptor

    path = str(Path(__file__).resolve().parents[1] / "examples" / "prompt_lookup")
    sys.path.insert(0, path)
    try:
        from specc_prompt_lookup import METHOD
    finally:
        sys.path.remove(path)
    descriptor._discover()
    return descriptor.register(METHOD)


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and the machine may be shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def huge_pages_lent(monkeypatch, tmp_path):
    """A kernel that lends 2 MiB huge pages on request (`madvise`), whatever this machine's says;
    returns its setting's file, which a test may rewrite."""
    from specc.host import huge_pages
    setting, size = tmp_path / "thp-enabled", tmp_path / "thp-hpage_pmd_size"
    setting.write_text("always [madvise] never\n")
    size.write_text(f"{2 * 2**20}\n")
    monkeypatch.setattr(huge_pages, "SETTING", setting)
    monkeypatch.setattr(huge_pages, "PAGE_SIZE", size)
    monkeypatch.delenv(huge_pages.ENV_VAR, raising=False)
    return setting
