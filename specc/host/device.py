"""Which device an engine compiles and runs on, and moving graphs there.

`--device` takes `auto` (a CUDA device when torch sees one, else the CPU),
`cpu`, `cuda` or `cuda:N`. Graphs are captured on the CPU; moving one to a
device moves its tensors and rewrites the device arguments torch.export
recorded in its nodes (`torch.arange(..., device=cpu)` and the like).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from specc.errors import UsageError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def resolve_device(text: str | torch.device | None) -> torch.device:
    """The device `text` names, checked against this machine; `auto`/None picks CUDA when present."""
    if isinstance(text, torch.device):
        text = str(text)
    text = (text or "auto").strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"--device {text!r} is not a device; use one of {DEVICE_CHOICES}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise UsageError(f"--device {text!r}: specc runs on {DEVICE_CHOICES}, not {device.type}")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {text}: this machine has no CUDA device (torch {torch.__version__} "
                         f"sees none); use --device cpu")
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered from 0")
    return torch.device("cuda", index)


def device_kind(device: torch.device | str) -> str:
    """`cpu` or `cuda`: what an engine's manifest records it was compiled for."""
    return torch.device(device).type


def move_graph(module: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """`module` with its parameters, buffers and tensor constants on `device` and every
    device argument in its graphs (submodules included) pointing there. In place; returned."""
    module.to(device)
    for gm in (m for m in module.modules() if isinstance(m, fx.GraphModule)):
        _move_tensor_constants(gm, device)
        changed = False
        for node in gm.graph.nodes:
            args, kwargs = _on_device(node.args, device), _on_device(node.kwargs, device)
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs, changed = args, kwargs, True
        if changed:
            gm.recompile()
    return module


def _move_tensor_constants(gm: fx.GraphModule, device: torch.device) -> None:
    """Tensors a graph reads with get_attr that are plain attributes (not parameters or buffers)."""
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        owner, _, name = str(node.target).rpartition(".")
        holder = gm.get_submodule(owner) if owner else gm
        value = getattr(holder, name, None)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                and name not in holder._buffers and value.device != device:
            setattr(holder, name, value.to(device))


def _on_device(value, device: torch.device):
    if isinstance(value, torch.device):
        return device if value.type != "meta" else value
    if isinstance(value, tuple):
        return tuple(_on_device(v, device) for v in value)
    if isinstance(value, list):
        return [_on_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    return value


def does_not_fit(error: torch.OutOfMemoryError, what: str) -> UsageError:
    """The usage error for `what` running out of device memory."""
    first = str(error).splitlines()[0] if str(error) else "out of memory"
    return UsageError(f"{what} does not fit in the device's memory ({first}); "
                      f"lower --max-seq-len or use a smaller dtype")
