"""Training added parameters at compile time, on the rewritten graphs themselves."""
