"""Import every built-in method module so each registers itself."""

from specc.methods import autoregressive, draft_model  # noqa: F401
