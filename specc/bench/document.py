"""Assemble the benchmark's JSON document from the timed runs.

Everything the report prints and the chart draws is read from this
document, so the printed figures are the recorded ones.
"""

from __future__ import annotations

import time

from specc.bench import statistics as st
from specc.bench.memory import MemoryProbe, process_peak_rss_bytes
from specc.bench.predict import draft_depth, predict
from specc.contract.descriptor import COMPILE_TIME_PREDICTION
from specc.bench.runner import Run
from specc.bench.llama_cpp import PEERS
from specc.bench.systems import ENGINE, HF_GREEDY, SPECC_NONE, System

SCHEMA = "specc-bench/1"
OVERALL = "overall"


# A method whose compile step predicts its own speedup stores {"speedup": x, "by": "how"} under this
# key of its manifest state; the report sets it beside the measured one.


def build_document(*, engine_manifest: dict, engine_path: str, model_info: dict, machine: dict, versions: dict,
                   settings: dict, prompts: list[dict], systems: list[System], runs: list[Run],
                   memory: MemoryProbe, notes: list[str], bandwidth_bound: dict | None = None) -> dict:
    reference = _outputs(runs, HF_GREEDY)
    lossless = bool(engine_manifest["lossless"])
    groups = {OVERALL: set(range(len(prompts)))}
    for category in dict.fromkeys(p["category"] for p in prompts):
        groups[category] = {p["index"] for p in prompts if p["category"] == category}
    gamma = draft_depth(engine_manifest)
    summaries = {name: summarize_group(runs, systems, indices, reference, gamma)
                 for name, indices in groups.items()}
    compile_time = engine_manifest.get("method_state", {}).get(COMPILE_TIME_PREDICTION)
    if compile_time is not None:
        for summary in summaries.values():
            summary["prediction"]["compile_time"] = compile_time
    identity = _lossless_identity(engine_manifest["dtype"], runs, groups[OVERALL], summaries[OVERALL])
    return {
        "schema": SCHEMA,
        "created_unix": int(time.time()),
        "machine": machine,
        "versions": versions,
        "model": model_info,
        "engine": engine_summary(engine_manifest, engine_path),
        "settings": settings,
        "notes": notes,
        "prompts": prompts,
        "systems": [s.describe() for s in systems],
        "overall": summaries[OVERALL],
        "categories": {k: v for k, v in summaries.items() if k != OVERALL},
        "memory": memory_summary(runs, systems, memory, summaries[OVERALL]),
        "bandwidth_bound": _with_none_share(bandwidth_bound, summaries[OVERALL]),
        "identity": identity,
        "identity_flag": lossless and identity["share"] is not None and identity["share"] < 1.0,
        "runs": [r.to_json() for r in runs],
    }


def _outputs(runs: list[Run], system: str) -> dict[int, list[int]]:
    return {r.prompt_index: r.token_ids for r in runs if r.system == system and r.repeat == 0}


def _lossless_identity(dtype: str, runs: list[Run], indices: set[int], overall: dict) -> dict:
    """What losslessness is checked against. In float32: HF greedy. In reduced precision HF
    and a compiled graph round differently (the same argmax is not guaranteed even for
    `none`), so a lossless method must reproduce specc's own `none` engine of the same
    dtype and backend instead."""
    if dtype == "float32":
        return {**overall["systems"][ENGINE]["identity_vs_hf_greedy"], "reference": HF_GREEDY}
    reference = _outputs(runs, SPECC_NONE)
    mine = [r for r in runs if r.system == ENGINE and r.prompt_index in indices]
    return {**st.identity({i: reference[i] for i in indices}, mine, ENGINE), "reference": SPECC_NONE}


def _with_none_share(bound: dict | None, overall: dict) -> dict | None:
    """The bound, with how much of it the compiled `none` engine's decoding reaches."""
    if bound is None:
        return None
    none = overall["systems"].get(SPECC_NONE, {}).get("decode_tokens_per_second")
    decode = none["median"] if none else None
    low, high = bound["bound_tokens_per_second_range"]
    return {**bound, "specc_none_decode_tokens_per_second": decode,
            "specc_none_share_of_bound": decode / bound["bound_tokens_per_second"] if decode else None,
            "specc_none_share_of_bound_range": [decode / high, decode / low] if decode else None}


def engine_summary(manifest: dict, path: str) -> dict:
    return {"path": path, "method": manifest["method"], "method_config": manifest["method_config"],
            "lossless": manifest["lossless"], "backend": manifest["backend"], "dtype": manifest["dtype"],
            "max_seq_len": manifest["max_seq_len"], "graphs": sorted(manifest["graphs"]),
            "versions": manifest.get("versions"), "compile_seconds": manifest.get("compile_seconds")}


def summarize_group(runs: list[Run], systems: list[System], indices: set[int], reference: dict[int, list[int]],
                    gamma: int | None) -> dict:
    throughput = {s.name: st.throughput_by_repeat(runs, s.name, indices) for s in systems}
    result: dict = {"prompts": len(indices), "systems": {}, "speedup": {}}
    for system in systems:
        mine = [r for r in runs if r.system == system.name and r.prompt_index in indices]
        entry = {
            "tokens_per_second": st.spread(throughput[system.name]).to_json(),
            "new_tokens_per_repeat": sum(len(r.token_ids) for r in mine if r.repeat == 0),
        }
        if system.name != HF_GREEDY:
            entry["identity_vs_hf_greedy"] = st.identity({i: reference[i] for i in indices}, mine, system.name)
        if system.name in PEERS:   # engines of their own, computing in other formats: agreement, not identity
            engine_outputs = {r.prompt_index: r.token_ids for r in runs if r.system == ENGINE and r.repeat == 0}
            entry["agreement_with_engine"] = st.identity({i: engine_outputs[i] for i in indices}, mine, system.name)
        stats = [r.stats for r in mine if r.stats is not None]
        if stats:
            entry["acceptance"] = st.acceptance(stats)
            entry["time_split"] = st.time_split(stats)
            decode = st.decode_throughput_by_repeat(runs, system.name, indices)
            entry["decode_tokens_per_second"] = st.spread(decode).to_json() if decode else None
        branches = st.branch_shares([r.method_report for r in mine if r.method_report])
        if branches is not None:
            entry["branches"] = branches
        result["systems"][system.name] = entry
        if system.role == "baseline":
            result["speedup"][system.name] = st.speedup(throughput[ENGINE], throughput[system.name]).to_json()
    result["prediction"] = _prediction(runs, indices, gamma, result)
    return result


def _prediction(runs: list[Run], indices: set[int], gamma: int | None, group: dict) -> dict:
    engine_stats = [r.stats for r in runs if r.system == ENGINE and r.prompt_index in indices]
    baseline_stats = [r.stats for r in runs if r.system == SPECC_NONE and r.prompt_index in indices]
    prediction = predict(engine_stats, baseline_stats, gamma)   # costs pooled over all repeats
    engine_decode = st.decode_throughput_by_repeat(runs, ENGINE, indices)
    none_decode = st.decode_throughput_by_repeat(runs, SPECC_NONE, indices)
    prediction["measured"] = {
        "speedup_over_specc_none": group["speedup"][SPECC_NONE]["median"],
        "decode_speedup_over_specc_none":
            st.speedup(engine_decode, none_decode).median if engine_decode and none_decode else None,
    }
    return prediction


def memory_summary(runs: list[Run], systems: list[System], memory: MemoryProbe, overall: dict | None = None) -> dict:
    per_system = {}
    for system in systems:
        mine = [r for r in runs if r.system == system.name and r.peak_rss_bytes is not None]
        per_system[system.name] = {
            "weights_bytes": system.weights_bytes,
            "peak_rss_bytes": max((r.peak_rss_bytes for r in mine), default=None),
            "peak_growth_bytes": max((r.peak_rss_bytes - r.rss_before_bytes for r in mine), default=None),
        }
    summary = {"method": memory.method, "process_peak_rss_bytes": process_peak_rss_bytes(), "systems": per_system}
    if overall is not None:
        summary["memory_normalized_speedup"] = _memory_normalized_speedup(per_system, overall)
    return summary


def _memory_normalized_speedup(per_system: dict, overall: dict) -> dict | None:
    """S3D's cost-effectiveness figure: the speedup over specc `none` divided by the engine's
    memory relative to `none`'s, memory being weights plus the RSS growth during a run."""
    def footprint(name):
        entry = per_system.get(name, {})
        if entry.get("weights_bytes") is None or entry.get("peak_growth_bytes") is None:
            return None
        return entry["weights_bytes"] + max(0, entry["peak_growth_bytes"])
    engine, none = footprint(ENGINE), footprint(SPECC_NONE)
    speedup = overall["speedup"].get(SPECC_NONE, {}).get("median")
    if not engine or not none or speedup is None:
        return None
    return {"speedup_over_specc_none": speedup, "relative_memory": engine / none,
            "value": speedup / (engine / none)}
