"""Look at what the passes did to a graph, from Python: capture a checkpoint,
run a method's recipe, and print each pass's record, the declared signature
and the rewritten graph's code.

    python examples/inspect_graph.py CHECKPOINT [--method kangaroo] [--graph deep]
"""

from __future__ import annotations

import argparse
import sys

from specc.capture.load import load_model, resolve_checkpoint
from specc.compiler import build_program
from specc.graph.signature import read_signature
from specc.contract.descriptor import get_method


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--method", default="kangaroo")
    parser.add_argument("--graph", default=None, help="the named graph to print (default: the method's first)")
    parser.add_argument("--max-seq-len", type=int, default=64)
    args = parser.parse_args()
    method = get_method(args.method)
    config = method.config_class()
    program = build_program({"target": load_model(resolve_checkpoint(args.checkpoint))}, method, config,
                            args.max_seq_len)
    name = args.graph or next(iter(program.graphs))
    graph = program.graphs[name]
    print(f"method {method.name}: graphs {', '.join(program.graphs)}; showing {name!r}")
    for record in (r for r in program.pass_records if r.graph == name):
        print(f"  {record.pass_name}: inserted {len(record.inserted)} nodes, replaced {len(record.replaced)}, "
              f"added inputs {record.added_inputs or '-'}")
    signature = read_signature(graph.module)
    for spec in signature.inputs + signature.outputs:
        print(f"  {spec.name}: {spec.role} {spec.dtype}{list(spec.shape)}")
    print(graph.module.code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
