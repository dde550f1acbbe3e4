"""What an export format is: a name, a line of help, and a writer that fills a directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specc.export.engine_files import EngineFiles


@dataclass(frozen=True)
class ExportRequest:
    engine: Path
    output: Path
    format: str = "eagle3"
    force: bool = False
    target_config: Path | None = None   # the target's config.json when the source checkpoint moved


@dataclass
class ExportReport:
    """What a format wrote; formats subclass it with their own details."""
    output: Path
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return "export written"


@dataclass(frozen=True)
class ExportFormat:
    name: str
    help: str    # what it writes and which runtimes read it (`specc export --help`)
    # Reads and checks what the format needs from the engine, before anything is written: a
    # refused engine leaves no directory behind. Returns what `write` takes.
    read: Callable[[ExportRequest, EngineFiles], Any]
    # Fills `staging` (an empty directory renamed over the output once whole) from what `read` returned.
    write: Callable[[ExportRequest, Any, Path], ExportReport]
    examples: str = ""   # command lines showing the format in use (`specc export --help`), one per line
