"""Fixtures for tests and examples: seeded tiny random checkpoints of every family (`checkpoints`) and
the exactness matrix every lossless method is held to (`exactness_matrix`)."""
