"""Lowering: turn a rewritten GraphModule into the callable the runtime steps."""
