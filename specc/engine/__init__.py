"""The engine directory: format, atomic writing, verified loading."""
