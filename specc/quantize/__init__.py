"""Weight-only quantized engines: the target's linear layers read int8 or int4 weights.

`schemes` turns a floating weight into the packed tensors of one scheme and builds
the matmul that reads them; `passes/quantize_linear_weights.py` rewrites a graph's
linears with it; `quality` measures what the scheme costs against the unquantized
model (top-1 agreement and perplexity on held-out text), recorded in the manifest;
`teacher` gives compile-time training a teacher with the weights the engine packs.
"""
