"""A benchmarked system: something that turns prompt ids into new token ids.

Every system decodes greedily from the same token ids, so outputs can be
compared token by token. Hugging Face systems return no statistics; specc
engines return their `GenerationStats`, and their method's own report
(`specc.runtime.method_report`) is taken after each generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specc.contract.sampling import SamplingConfig
from specc.runtime.method_report import method_report
from specc.runtime.stats import GenerationStats

GenerateFn = Callable[[list[int]], "tuple[list[int], GenerationStats | None]"]

HF_GREEDY = "hf-greedy"
HF_STATIC = "hf-static-cache"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
HF_ASSISTED = "hf-assisted"
SPECC_NONE = "specc-none"
ENGINE = "engine"


@dataclass
class System:
    name: str                  # key used in the JSON, e.g. "hf-greedy"
    label: str                 # for people, e.g. "HF generate, greedy"
    role: str                  # "baseline" or "engine"
    generate: GenerateFn
    weights_bytes: int
    config: dict = field(default_factory=dict)
    # What the method reports about the generations since the last call, its counts then
    # starting again ({}: nothing to report); None for systems with no method of their own.
    take_method_report: Callable[[], dict] | None = None

    def describe(self) -> dict:
        return {"name": self.name, "label": self.label, "role": self.role,
                "weights_bytes": self.weights_bytes, "config": self.config}


def hf_system(name: str, label: str, model, max_new_tokens: int, assistant=None, **options) -> System:
    """`model.generate` (greedy, batch 1) with extra generation `options`."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
        eos_token_id=model.generation_config.eos_token_id, pad_token_id=_pad_id(model),
        **options,
    )

    def generate(prompt_ids: list[int]):
        input_ids = torch.tensor([prompt_ids], device=model.device)
        extra = {"assistant_model": assistant} if assistant is not None else {}
        with torch.inference_mode():
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                    generation_config=config, **extra)
        return output[0, len(prompt_ids):].tolist(), None

    weights = _parameter_bytes(model) + (_parameter_bytes(assistant) if assistant is not None else 0)
    return System(name, label, "baseline", generate, weights, {"generation_options": options})


def engine_system(name: str, label: str, role: str, engine, max_new_tokens: int) -> System:
    """A loaded specc engine, decoding greedily."""
    greedy = SamplingConfig()

    def generate(prompt_ids: list[int]):
        result = engine.generate_ids(prompt_ids, max_new_tokens, greedy)
        return result.token_ids, result.stats

    config = {"path": str(engine.path), "method": engine.manifest["method"],
              "method_config": engine.manifest["method_config"], "backend": engine.backend.name}
    return System(name, label, role, generate, engine_weights_bytes(engine.path), config,
                  take_method_report=lambda: method_report(engine.runtime))


def engine_weights_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "weights").glob("*.safetensors"))


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _pad_id(model) -> int | None:
    pad = model.generation_config.pad_token_id
    if pad is None:
        eos = model.generation_config.eos_token_id
        pad = eos[0] if isinstance(eos, list) else eos
    return pad
