"""Compile a checkpoint into an engine and generate from Python, streaming.

    python examples/compile_and_generate.py CHECKPOINT [--method none] [--prompt TEXT]

CHECKPOINT is a Hugging Face checkpoint directory, e.g. the path that
`python -m specc.refmodels build tiny` prints.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import specc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--method", default="none")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompt", default="def quicksort(xs):")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.settings)
    with tempfile.TemporaryDirectory() as scratch:
        engine_dir = Path(scratch) / "engine"
        specc.compile(args.checkpoint, args.method, engine_dir, settings=settings)
        engine = specc.load(engine_dir)
        print(args.prompt, end="", flush=True)
        for piece in engine.stream(args.prompt, max_new_tokens=args.max_new_tokens):
            print(piece, end="", flush=True)
        print()
        result = engine.generate(args.prompt, max_new_tokens=args.max_new_tokens)
        print(f"[{result.stats.new_tokens} tokens, mean accepted length {result.stats.mean_accepted_length:.2f}]",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
