"""Graph passes: one verb-named pass per module, each with a typed config."""
