"""A quantized teacher: the model compile-time training distills from, with the weights the
quantized engine computes with.

Methods train their heads to predict the target's next tokens; on a quantized engine the
target that verifies is the quantized one, so its choices, not the unquantized model's, are
what a draft has to guess. `round_linear_weights` gives a loaded model every linear weight
that `--quantize` packs, rounded through the engine's scheme and back to floating point
(the same selection and rounding as the engine: `scheme_for`, `Scheme.dequantize`, from the
engine's dtype), so the captured graphs and every method's passes stay what they are. Under
`q4`/`q6`/`q8` the engine also rounds activations to int8 per block; the teacher does not (its
graphs would change, and the rounding has no gradient).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # torch stays unimported until a teacher is rounded: the command line reads TEACHERS
    import torch

    from specc.quantize.schemes import Scheme

TEACHERS = ("unquantized", "quantized")


def round_linear_weights(model: torch.nn.Module, scheme: Scheme, engine_dtype: torch.dtype) -> int:
    """Replace every floating `nn.Linear` weight of `model` by its rounding through `scheme` (as
    packed from `engine_dtype`), untying it from any tensor it shared (a tied LM head keeps the
    embedding table the engine keeps); returns how many weights were rounded."""
    import torch

    from specc.quantize.quality import linear_schemes

    rounded = 0
    for module, chosen in linear_schemes(model, scheme):
        weight = module.weight
        with torch.no_grad():
            values = chosen.dequantize(weight.detach().to(engine_dtype)).to(weight.dtype)
        module.weight = torch.nn.Parameter(values, requires_grad=weight.requires_grad)
        rounded += 1
    return rounded
