"""`--format eagle3`: an `eagle` engine's head as an EAGLE-3 draft checkpoint directory
(config.json, model.safetensors, README.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from specc.export.eagle3 import Eagle3Draft, eagle3_draft
from specc.export.eagle3_config import eagle3_config, read_target_config
from specc.export.engine_files import EngineFiles
from specc.export.format import ExportFormat, ExportReport, ExportRequest

WEIGHTS = "model.safetensors"


@dataclass
class Eagle3Report(ExportReport):
    fused_layers: list[int] | None = None
    draft_vocab_size: int = 0
    vocab_size: int = 0

    def summary(self) -> str:
        return (f"EAGLE-3 draft, draft vocabulary {self.draft_vocab_size} of {self.vocab_size} tokens, fusing the "
                f"inputs of target layers {self.fused_layers}")


@dataclass(frozen=True)
class Eagle3Export:
    engine: EngineFiles
    draft: Eagle3Draft
    config: dict
    target_path: Path | None


def read_eagle3(request: ExportRequest, engine: EngineFiles) -> Eagle3Export:
    draft = eagle3_draft(engine)
    target, target_path = read_target_config(engine, request.target_config)
    return Eagle3Export(engine, draft, eagle3_config(draft, engine, target, target_path), target_path)


def write_eagle3(request: ExportRequest, export: Eagle3Export, staging: Path) -> Eagle3Report:
    engine, draft, config, target_path = export.engine, export.draft, export.config, export.target_path
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(draft.tensors, str(staging / WEIGHTS), metadata={"format": "pt"})
    (staging / "README.md").write_text(_readme(request, engine, draft, config, target_path))
    return Eagle3Report(request.output, list(draft.warnings), draft.fused_layers, draft.draft_vocab_size,
                        draft.dims.vocab)


def _readme(request: ExportRequest, engine: EngineFiles, draft: Eagle3Draft, config: dict,
            target_path: Path | None) -> str:
    manifest = engine.manifest
    source = manifest.get("source_checkpoint", "TARGET")
    reduced = "d2t" in draft.tensors
    sglang_ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    files = [
        "- `config.json`: a one-layer `LlamaForCausalLMEagle3` config. `eagle_aux_hidden_state_layer_ids` "
        f"{config['eagle_aux_hidden_state_layer_ids']} (vLLM: the residual stream entering those target layers) "
        f"and `eagle_config.eagle_aux_hidden_state_layer_ids` {sglang_ids} "
        "(SGLang: the outputs of the layers before them) name the same three hidden states.",
        f"- `{WEIGHTS}`: `fc`, `midlayer.*`, `norm` and `lm_head` ({draft.draft_vocab_size} rows"
        + (", in ascending target-id order), with `d2t` (draft row i is target token i + d2t[i]) and `t2d` "
           "(True for the target ids the draft proposes)." if reduced else
           ", row i is target token i; no d2t/t2d, as the head covers the whole vocabulary).")
        + " No embedding: vLLM and SGLang share the target's.",
        "- `README.md`: this file.",
    ]
    lines = [
        "# EAGLE-3 draft exported by specc", "",
        f"Exported by `specc export {request.engine} --format {request.format}` from a specc `{manifest['method']}` "
        f"engine (specc {manifest.get('versions', {}).get('specc', '?')}, {manifest['dtype']}, compiled from "
        f"`{source}`; weights/added.safetensors sha256 "
        f"{manifest['files'].get('weights/added.safetensors', '-')}).",
        f"The target config came from `{target_path}`." if target_path else
        "No target config.json was readable: shapes and RoPE came from the engine's manifest.",
        "", "## Files", "", *files, "",
        "## Serving (commands not run by specc; the layout was checked against the loaders' source)", "",
        "```bash",
        f"vllm serve {source} --speculative-config "
        f"'{{\"method\": \"eagle3\", \"model\": \"{request.output}\", \"num_speculative_tokens\": 3}}'",
        f"python -m sglang.launch_server --model-path {source} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {request.output} --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
        "```", "",
        "The target must be the checkpoint the engine was compiled from (same weights, same tokenizer).",
    ]
    if draft.warnings:
        lines += ["", "## Warnings", "", *[f"- {w}" for w in draft.warnings]]
    return "\n".join(lines) + "\n"


EAGLE3 = ExportFormat(
    "eagle3",
    "an `eagle` engine's head as the EAGLE-3 draft (config.json, model.safetensors) that vLLM's and SGLang's "
    "LlamaForCausalLMEagle3 read; the layout was checked against their loader source, not run (docs/export.md)",
    read_eagle3, write_eagle3,
    examples="specc export engines/smollm2 --format eagle3 -o drafts/eagle3\n"
             "vllm serve MODEL --speculative-config '{\"method\": \"eagle3\", \"model\": \"drafts/eagle3\"}'\n")
