"""specc's kernels as `torch.ops.specc.*` custom operators: Triton kernels for verification,
and the CPU's blocked low-bit matmul (C++, compiled on first use).

Importing this package registers the operators (it imports torch only,
never triton); `KERNELS` lists them. See README.md in this folder.
"""

from specc.kernels import blocked_matmul, decoder_chain, ops, row_argmax, row_attention  # noqa: F401  (register torch.ops.specc.*)
from specc.kernels.registry import KERNELS, Kernel, kernel_revisions, kernels_in_graph

__all__ = ["KERNELS", "Kernel", "kernel_revisions", "kernels_in_graph"]
