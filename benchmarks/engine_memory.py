"""What an engine costs in memory and on disk: its files, and a fresh process's resident memory
after loading it and decoding a few tokens.

    python benchmarks/engine_memory.py build/smol/none-q4 build/q15/none-q4

Each engine is measured in a process of its own (`python -m` this script `--one ENGINE`):
resident memory (VmRSS) split into anonymous memory (RssAnon: what the process allocated) and
file pages (RssFile: mapped files, the page cache's to reclaim), before loading (Python, torch,
specc), after loading, and after a 32-token decode; and the bytes of the engine's directory
and of its `compiled/` artifacts. Prints a table; `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FIELDS = ("VmRSS", "RssAnon", "RssFile")
DECODED_TOKENS = 32


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)   # measure one engine, in this process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(measure_here(args.engines[0])))
        return 0
    figures = [measure_apart(engine) for engine in args.engines]
    print(format_table(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def measure_apart(engine: Path) -> dict:
    run = subprocess.run([sys.executable, __file__, "--one", str(engine)], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"measuring {engine} failed:\n{run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def measure_here(engine: Path) -> dict:
    import torch

    from specc.bench.harness import quiet_transformers
    from specc.engine.loaded import load_engine
    from specc.host.threads import apply_threads

    apply_threads()
    quiet_transformers()
    figures = {"engine": str(engine), "files_bytes": _bytes_under(engine),
               "compiled_bytes": _bytes_under(engine / "compiled"), "before_load": resident()}
    loaded = load_engine(engine)
    figures["after_load"] = resident()
    vocab = loaded.architecture("target").vocab_size
    with torch.inference_mode():
        loaded.generate_ids([i % vocab for i in range(100, 164)], DECODED_TOKENS)
    figures["after_decode"] = resident()
    return figures


def resident() -> dict[str, int]:
    """This process's resident memory in bytes, by kind (/proc/self/status)."""
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in FIELDS:
            status[name] = int(value.split()[0]) * 1024
    return status


def _bytes_under(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def format_table(figures: list[dict]) -> str:
    mb = lambda n: f"{n / 1e6:,.0f}"   # noqa: E731
    rows = ["| engine | files MB (compiled/) | resident MB after decode (anonymous + file) | growth over Python+torch MB |",
            "| --- | --- | --- | --- |"]
    for f in figures:
        after, before = f["after_decode"], f["before_load"]
        rows.append(f"| {f['engine']} | {mb(f['files_bytes'])} ({mb(f['compiled_bytes'])}) | "
                    f"{mb(after['VmRSS'])} ({mb(after['RssAnon'])} + {mb(after['RssFile'])}) | "
                    f"{mb(after['VmRSS'] - before['VmRSS'])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
