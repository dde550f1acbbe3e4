"""Triton kernels for verification, as `torch.ops.specc.*` custom operators.

Importing this package registers the operators (it imports torch only,
never triton); `KERNELS` lists them. See README.md in this folder.
"""

from specc.kernels import ops  # noqa: F401  (registers torch.ops.specc.*)
from specc.kernels.registry import KERNELS, Kernel, kernels_in_graph

__all__ = ["KERNELS", "Kernel", "kernels_in_graph"]
