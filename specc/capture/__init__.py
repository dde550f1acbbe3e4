"""Capture: load a Hugging Face checkpoint and export it unmodified."""
