"""`specc export`: an engine's trained drafter in a checkpoint layout other runtimes load.

Formats are registered in write.py's `FORMATS` (each an `ExportFormat`: name,
help, reader, writer). One so far: `eagle3` (an `eagle` engine's head as the EAGLE-3
draft checkpoint of vLLM's and SGLang's `LlamaForCausalLMEagle3`;
eagle3_format.py, eagle3.py, eagle3_config.py). Export reads the engine's
manifest and safetensors files only: no graph is rebuilt and nothing is
lowered. docs/export.md says what the layout was checked against.
"""

from specc.export.format import ExportFormat, ExportReport, ExportRequest
from specc.export.write import FORMATS, export_engine

__all__ = ["FORMATS", "ExportFormat", "ExportReport", "ExportRequest", "export_engine"]
