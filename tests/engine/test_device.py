"""--device: resolving what the user named, and moving a captured graph to a device."""

from __future__ import annotations

import pytest
import torch

from specc.host.device import device_kind, move_graph, resolve_device
from specc.errors import UsageError
from specc.testing.checkpoints import captured_tiny


def test_auto_is_cuda_when_present_else_the_cpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(None) == resolve_device("auto")
    assert resolve_device("CPU") == torch.device("cpu")
    assert device_kind("cuda:1") == "cuda" and device_kind(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("text, message", [
    ("gpu0", "is not a device"),
    ("mps", "specc runs on auto, cpu, cuda, cuda:N, not mps"),
])
def test_what_specc_does_not_run_on_is_named(text, message):
    with pytest.raises(UsageError, match=message):
        resolve_device(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(UsageError, match="this machine has no CUDA device"):
        resolve_device("cuda:0")


def test_moving_a_captured_graph_rewrites_the_devices_export_recorded():
    """torch.export records `device=cpu` in factory calls (aranges, masks); a graph moved to
    another device must create those tensors there, and hold its weights there."""
    gm = captured_tiny("llama")[1].graph_module
    recorded = [n for n in gm.graph.nodes if torch.device("cpu") in _devices(n)]
    assert recorded, "the capture recorded no device: the test lost its subject"
    move_graph(gm, torch.device("meta"))
    assert not [n for n in gm.graph.nodes if torch.device("cpu") in _devices(n)]
    assert all(t.device.type == "meta" for t in (*gm.parameters(), *gm.buffers()))
    assert "device(type='cpu')" not in gm.code


def _devices(node) -> list:
    found = []
    torch.fx.node.map_aggregate((node.args, node.kwargs),
                                lambda v: found.append(v) if isinstance(v, torch.device) else None)
    return found
