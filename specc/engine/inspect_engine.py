"""`specc inspect`: what the passes did to each graph of an engine."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from specc.engine.verify import read_verified_manifest
from specc.errors import UsageError
from specc.quantize.report import describe_reports


def inspect_engine(engine_dir: Path, graph: str | None = None, after: str | None = None) -> str:
    manifest = read_verified_manifest(engine_dir)
    graphs = manifest["graphs"]
    if graph is not None and graph not in graphs:
        raise UsageError(f"engine has no graph {graph!r}; it has: {', '.join(graphs)}")
    if after is not None:
        return _graph_after(engine_dir, manifest, graph or "target", after)
    if graph is not None:
        return (engine_dir / "ir" / graph / _ir_files(engine_dir, graph)[-1]).read_text()
    return _summary(engine_dir, manifest)


def _summary(engine_dir: Path, manifest: dict) -> str:
    lines = [
        f"engine {engine_dir}",
        f"  method {manifest['method']}  config {json.dumps(manifest['method_config'])}",
        f"  backend {manifest['backend']}  dtype {manifest['dtype']}  max_seq_len {manifest['max_seq_len']}  "
        f"device {manifest.get('device', 'cpu')}",
        *(f"  {line}" for line in describe_reports(manifest)),
    ]
    for name, entry in manifest["graphs"].items():
        arch = entry["architecture"]
        lines.append(f"\ngraph {name}  (from {entry['source']}: {arch['model_type']}, {arch['num_layers']} layers)")
        lines.append(f"  inputs: {', '.join(_abbreviate(entry['inputs']))}")
        lines += _describe_signature(entry["signature"])
        lines.append("  nodes by op: " + _format_counts(node_counts(engine_dir, name)))
        if name in manifest.get("kernels", {}):
            lines.append(f"  kernels: {', '.join(manifest['kernels'][name])} (torch.ops.specc, see specc/kernels)")
        lines += _describe_lowering(manifest, name)
        for record in (r for r in manifest["passes"] if r["graph"] == name):
            lines += _describe_pass(record)
    for key, value in manifest.get("method_state", {}).items():
        lines.append(f"\n{key}: {value if isinstance(value, str) else state_value(value)}")
    return "\n".join(lines) + "\n"


def _describe_signature(signature: dict) -> list[str]:
    """Inputs grouped by role (k/v caches are many), then every output."""
    roles: dict[str, list[dict]] = {}
    for spec in signature["inputs"]:
        roles.setdefault(spec["role"], []).append(spec)
    def shape(spec):
        return f"{spec['dtype']}[{', '.join(map(str, spec['shape']))}]"
    lines = ["  signature in:  " + "; ".join(
        f"{role} {shape(specs[0])}" + (f" x{len(specs)}" if len(specs) > 1 else f" ({specs[0]['name']})")
        for role, specs in roles.items())]
    lines.append("  signature out: " + "; ".join(f"{s['name']} ({s['role']}) {shape(s)}" for s in signature["outputs"]))
    return lines


def _describe_lowering(manifest: dict, graph: str) -> list[str]:
    """What an ahead-of-time backend wrote for the graph, and how long it took."""
    lowered = manifest.get("lowered", {}).get(graph)
    if lowered is None:
        return []
    files = ", ".join(f"{name} ({size / 1e6:.1f} MB)" for name, size in lowered["files"].items())
    return [f"  lowered by {manifest['backend']} in {lowered['seconds']:.1f}s: {files}"]


def node_counts(engine_dir: Path, graph: str) -> Counter:
    nodes = json.loads((engine_dir / "graphs" / f"{graph}.json").read_text())["nodes"]
    counts: Counter = Counter()
    for node in nodes:
        if node["op"] == "call_function":
            counts[node["target"].removeprefix("torch.ops.")] += 1
        else:
            counts[node["op"]] += 1
    return counts


def _format_counts(counts: Counter) -> str:
    return ", ".join(f"{op}={count}" for op, count in counts.most_common())


def _describe_pass(record: dict) -> list[str]:
    status = "changed" if record["modified"] else "no change"
    lines = [f"  pass {record['pass_name']} ({status}, {record['seconds']:.3f}s)"]
    if record["added_inputs"]:
        lines.append(f"    added inputs: {', '.join(_abbreviate(record['added_inputs']))}")
    if record["replaced"]:
        lines.append(f"    rewired/replaced: {', '.join(_abbreviate(record['replaced']))}")
    if record["inserted"]:
        lines.append(f"    inserted {len(record['inserted'])} nodes: {', '.join(_abbreviate(record['inserted']))}")
    if record["added_parameters"]:
        lines.append(f"    added parameters: {', '.join(record['added_parameters'])}")
    return lines


def state_value(value, limit: int = 16, records: int = 2) -> str:
    """A method-state value as its repr, long lists (a reduced vocabulary holds thousands
    of token ids) cut to their first `limit` items and their length. A list of records
    (a training curve of dicts) keeps its first `records` and its last, where it ended."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {state_value(item, limit)}" for key, item in value.items()) + "}"
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        if len(value) <= records + 2:
            return "[" + ", ".join(state_value(item, limit) for item in value) + "]"
        head = [state_value(item, limit) for item in value[:records]]
        return "[" + ", ".join([*head, f"… ({len(value)} items)", state_value(value[-1], limit)]) + "]"
    if isinstance(value, list):
        items = [state_value(item, limit) for item in value[:limit]]
        if len(value) > limit:
            items.append(f"… ({len(value)} items)")
        return "[" + ", ".join(items) + "]"
    return repr(value)


def _abbreviate(names: list[str], limit: int = 8) -> list[str]:
    return names if len(names) <= limit else names[:limit] + [f"… (+{len(names) - limit} more)"]


def _ir_files(engine_dir: Path, graph: str) -> list[str]:
    return sorted(p.name for p in (engine_dir / "ir" / graph).glob("*.txt"))


def _graph_after(engine_dir: Path, manifest: dict, graph: str, pass_name: str) -> str:
    files = _ir_files(engine_dir, graph)
    match = [f for f in files if f.split("_", 1)[1].removesuffix(".txt") == pass_name]
    if not match:
        names = [f.split("_", 1)[1].removesuffix(".txt") for f in files]
        raise UsageError(f"graph {graph!r} has no pass {pass_name!r}; passes recorded: {', '.join(names)}")
    return (engine_dir / "ir" / graph / match[0]).read_text()
