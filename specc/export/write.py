"""`specc export ENGINE --format F -o DIR`: write the checkpoint directory, atomically.

The directory is built beside DIR and renamed over it only when whole (the
engine writer's `staging_dir`), so a failed export leaves nothing behind and
an existing DIR is replaced only with `--force`.
"""

from __future__ import annotations

from specc.engine.save import staging_dir
from specc.errors import UsageError
from specc.export.eagle3_format import EAGLE3
from specc.export.engine_files import EngineFiles
from specc.export.format import ExportFormat, ExportReport, ExportRequest

FORMATS: dict[str, ExportFormat] = {f.name: f for f in (EAGLE3,)}


def export_engine(request: ExportRequest) -> ExportReport:
    export_format = FORMATS.get(request.format)
    if export_format is None:
        raise UsageError(f"--format {request.format!r} is not an export format; choose from {', '.join(FORMATS)}")
    _check_output(request)
    contents = export_format.read(request, EngineFiles.open(request.engine))
    # force=True: `_check_output` has already refused a non-empty DIR without --force.
    with staging_dir(request.output, force=True) as staging:
        return export_format.write(request, contents, staging)


def _check_output(request: ExportRequest) -> None:
    output, engine = request.output.resolve(), request.engine.resolve()
    if output == engine or output in engine.parents:
        raise UsageError(f"-o {request.output} would replace the engine {request.engine}; write the export elsewhere")
    if output.exists() and not output.is_dir():
        raise UsageError(f"-o {request.output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not request.force:
        raise UsageError(f"output directory {request.output} already exists and is not empty; pass --force to "
                         f"replace it")
    if output.parent.exists() and not output.parent.is_dir():
        raise UsageError(f"{output.parent} is a file, so {request.output} cannot be created inside it")
