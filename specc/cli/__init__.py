"""The `specc` command line. Verbs import heavy modules lazily."""
