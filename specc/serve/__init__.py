"""`specc serve`: an OpenAI-compatible HTTP server over one engine (needs the `serve` extra)."""
