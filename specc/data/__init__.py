"""The data specc reads and the files it caches, for core, methods, bench and refmodels alike.

`prompts`: the benchmark and calibration prompt sets; `stdlib_prompts`: prompts cut
from Python's standard library; `corpora`: training and calibration text;
`files`: the cache root and atomic directory writes.
"""
