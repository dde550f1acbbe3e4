"""`specc bench ENGINE_DIR`: the CLI verb over `harness.benchmark`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specc.bench.harness import BenchOptions, benchmark
from specc.bench.report import format_report, identity_banner

# Exit status when a lossless engine's greedy output differs from HF greedy:
# the figures are still printed and written, but scripts must not read the
# run as a success.
LOSSLESS_CHECK_FAILED = 3


def run_bench(args) -> int:
    options = BenchOptions(engine=args.engine, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                           repeats=args.repeats, num_prompts=args.num_prompts,
                           chat_template=not getattr(args, "no_chat_template", False),
                           device=getattr(args, "device", None), peers=tuple(getattr(args, "baseline", ()) or ()),
                           gguf=getattr(args, "gguf", None), settings=tuple(getattr(args, "settings", ()) or ()))
    doc = benchmark(options)
    print(format_report(doc), end="")
    banner = identity_banner(doc)
    if banner:
        print(banner, end="", file=sys.stderr)
    if args.json_out:
        write_json(doc, args.json_out)
        print(f"wrote {args.json_out}", file=sys.stderr)
    if args.plot:
        from specc.bench.plot import write_chart

        write_chart(doc, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return LOSSLESS_CHECK_FAILED if banner else 0


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
