"""specc: compile a Hugging Face causal LM into a speculative inference engine.

Importing this package is light on purpose: torch, transformers and any
backend are imported by the modules that need them.
"""

__version__ = "0.1.0"
