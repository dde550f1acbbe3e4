"""The exactness matrix as a table: every lossless method × family × backend on quirky tiny
checkpoints (`specc.testing.exactness_matrix`), float32 against Hugging Face greedy and bfloat16
against the bfloat16 `none` engine of the same backend.

    python benchmarks/matrix.py [--backends eager,onnx] [--methods none,specee] [--families mistral]
        [--dtypes float32,bfloat16] [--output benchmarks/results/exactness-matrix.md]

Each cell: ✓ (accepted/drafted draft tokens over the prompts), ✗ with the first differing
prompt and token, "compiled lossy" (the compiler marked the engine lossy and said why, e.g.
FIRP in bfloat16; whether it happened to match is shown), "refused: reason" (a compile-time
refusal), or "error: ..." (a crash).
bfloat16 rows use one family (`--bfloat16-family`). Exits non-zero if any cell failed.
Cells run in this process one after another (tiny models, one thread).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

def main(argv: list[str] | None = None) -> int:
    from specc.testing.exactness_matrix import BACKENDS, METHODS
    from specc.testing.checkpoints import QUIRKY_MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--families", default=",".join(QUIRKY_MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--bfloat16-family", default="llama")
    parser.add_argument("--output", type=Path, help="write the table (markdown) here too")
    args = parser.parse_args(argv)
    results = measure(args.methods.split(","), args.families.split(","), args.backends.split(","),
                      args.dtypes.split(","), args.bfloat16_family)
    text = table(results)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0 if all(r.passed for r in results) else 1


def measure(methods, families, backends, dtypes, bfloat16_family) -> list:
    import torch
    from tqdm import tqdm

    from specc.testing.exactness_matrix import Cell, QuirkyCheckpoints, run_cell
    from specc.contract.descriptor import get_method

    for method in methods:
        get_method(method)   # an unknown or uninstalled method stops here, with its error
    torch.set_num_threads(1)
    # In bfloat16 the reference is the `none` engine itself, so `none` has no cell there.
    cells = [Cell(m, f, b, d) for d in dtypes for b in backends for m in methods
             for f in (families if d == "float32" else [bfloat16_family]) if d == "float32" or m != "none"]
    with tempfile.TemporaryDirectory(prefix="specc-matrix-") as root:
        checkpoints, cache = QuirkyCheckpoints(Path(root) / "checkpoints"), {}
        results = []
        for cell in tqdm(cells, desc="exactness matrix", unit="cell"):
            results.append(run_cell(cell, checkpoints, Path(root), cache))
            tqdm.write(f"{cell.label}: {results[-1].mark()}")
    return results


def table(results) -> str:
    """One markdown table per (dtype, backend): methods as rows, families as columns."""
    from specc.testing.checkpoints import QUIRKS

    lines = ["# Exactness matrix", "",
             "float32: token-identical to Hugging Face greedy `generate`; bfloat16: to the bfloat16 `none` "
             "engine of the same backend. Quirks per family: "
             + "; ".join(f"{f}: {', '.join(f'{k}={v}' for k, v in q.items())}" for f, q in QUIRKS.items()), ""]
    groups: dict[tuple[str, str], list] = {}
    for r in results:
        groups.setdefault((r.cell.dtype, r.cell.backend), []).append(r)
    for (dtype, backend), group in groups.items():
        families = list(dict.fromkeys(r.cell.family for r in group))
        methods = list(dict.fromkeys(r.cell.method for r in group))
        marks = {(r.cell.method, r.cell.family): r.short_mark() for r in group}
        lines += [f"## {backend}, {dtype}", "", "| method | " + " | ".join(families) + " |",
                  "|---|" + "---|" * len(families)]
        lines += [f"| {m} | " + " | ".join(marks.get((m, f), "") for f in families) + " |" for m in methods]
        lines.append("")
    failed = [r for r in results if not r.passed]
    lines.append(f"{len(results) - len(failed)} of {len(results)} cells identical, compiled lossy (declared) or refused"
                 + (f"; failed: {', '.join(r.cell.label for r in failed)}" if failed else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
