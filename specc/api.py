"""The Python API, mirroring the command line: compile, load, generate, stream.

    import specc
    specc.compile("ckpt/", "kangaroo", "engine/", settings={"train_steps": 300})
    engine = specc.load("engine/")
    print(engine.generate("def quicksort(xs):", max_new_tokens=48).text)
    for piece in engine.stream("def quicksort(xs):"):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specc.runtime.stats import GenerationStats


@dataclass
class Generation:
    text: str
    token_ids: list[int]       # generated ids only
    stats: GenerationStats


def compile(model: str | Path, method: str, output: str | Path, *, backend: str = "eager",
            dtype: str = "float32", max_seq_len: int = 1024, settings: dict | None = None,
            force: bool = False, progress: bool = False, kernels: bool = False, device: str = "auto",
            quantize: str | None = None, quantize_draft: str | None = None, teacher: str = "unquantized") -> dict:
    """`specc compile`: write an engine for `model` to `output`; returns the manifest's fields.
    `settings` are the method's config fields (see `specc methods`); `kernels` is `--kernels`;
    `device` is `--device` (auto, cpu, cuda, cuda:N); `quantize` is `--quantize` (q4, int8, …); `quantize_draft` is `--quantize-draft`;
    `teacher` is `--teacher`."""
    from specc.compiler import CompileRequest, compile_engine

    return compile_engine(CompileRequest(model=str(model), method=method, output=Path(output), backend=backend,
                                         dtype=dtype, max_seq_len=max_seq_len, force=force,
                                         settings=dict(settings or {}),
                                         kernels=kernels, show_progress=progress, device=device,
                                         quantize=quantize, quantize_draft=quantize_draft, teacher=teacher))


def load(engine: str | Path, backend: str | None = None, device: str | None = None,
         settings: dict | None = None) -> "Engine":
    """`specc run`'s loader: verify the engine's files and build its runtime on `device`
    (default auto: a CUDA device when present; an aoti engine: the kind it was compiled for);
    `settings` changes lookup branch fields as the engine loads (`--set`, e.g. {"lookup": True})."""
    from specc.engine.loaded import load_engine

    return Engine(load_engine(engine, backend, device, [f"{k}={v}" for k, v in (settings or {}).items()]))


class Engine:
    def __init__(self, loaded):
        self.loaded = loaded

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def manifest(self) -> dict:
        return self.loaded.manifest

    def generate(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, reuse_prefix: bool = False) -> Generation:
        """Text and ids after `prompt` (text, or token ids), with acceptance statistics.
        temperature 0 decodes greedily (token-identical to HF greedy for lossless methods).
        `reuse_prefix` prefills only what the previous generation did not leave in the KV cache
        (as `specc chat` does; docs/cli.md#prefix-reuse)."""
        ids = self._ids(prompt)
        result = self.loaded.generate_ids(ids, max_new_tokens, _sampling(temperature, top_p, seed),
                                          reuse_prefix=reuse_prefix)
        return Generation(self.tokenizer.decode(result.token_ids, skip_special_tokens=True), result.token_ids,
                          result.stats)

    def stream(self, prompt: str | list[int], max_new_tokens: int = 64, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None, reuse_prefix: bool = False) -> Iterator[str]:
        """The generated text piece by piece, as each round's tokens are accepted
        (`reuse_prefix` as for `generate`)."""
        from specc.runtime.textgen import TextDelta

        rounds = self.loaded.rounds(self._ids(prompt), max_new_tokens, _sampling(temperature, top_p, seed),
                                    reuse_prefix=reuse_prefix)
        text = TextDelta(self.tokenizer)
        for ids in rounds:
            piece = text.add(ids)
            if piece:
                yield piece

    def _ids(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, (list, tuple)) else self.loaded.encode(prompt)


def _sampling(temperature: float, top_p: float, seed: int | None):
    from specc.contract.sampling import SamplingConfig

    return SamplingConfig(temperature=temperature, top_p=top_p, seed=seed)
