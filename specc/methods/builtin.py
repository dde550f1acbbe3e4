"""Import every built-in method module so each registers itself."""

from specc.methods import autoregressive, draft_model  # noqa: F401
from specc.methods import swift  # noqa: F401
from specc.methods import kangaroo  # noqa: F401
