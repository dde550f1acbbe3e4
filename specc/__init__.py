"""specc: compile a Hugging Face causal LM into a speculative inference engine.

Importing this package is light on purpose: torch, transformers and any
backend are imported by the modules that need them.
"""

__version__ = "0.1.0"

__all__ = ["compile", "load", "__version__"]


def __getattr__(name: str):
    if name in ("compile", "load", "Engine", "Generation"):
        from specc import api

        return getattr(api, name)
    raise AttributeError(f"module 'specc' has no attribute {name!r}")
