"""The benchmark document as text: a table per category and overall, the
prediction beside the measurement, memory, and a loud banner when a
lossless engine's output differs from Hugging Face greedy decoding."""

from __future__ import annotations

from specc.bench.systems import ENGINE


def format_report(doc: dict) -> str:
    engine, settings, model = doc["engine"], doc["settings"], doc["model"]
    lines = [
        f"specc bench: {engine['path']} — method {engine['method']} ({engine['backend']}, {engine['dtype']}, "
        f"{'lossless' if engine['lossless'] else 'lossy'}) on {settings.get('device', 'cpu')}",
        f"model {model['model_type']} {model['parameters'] / 1e6:.2f}M params ({model['checkpoint']}); "
        f"prompts {settings['prompt_set']} x{settings['num_prompts']}; {settings['max_new_tokens']} new tokens; "
        f"{settings['repeats']} repeat(s) after 1 warm-up per system; greedy, batch 1",
        *_threads_line(doc["machine"]),
    ]
    labels = {s["name"]: s["label"] for s in doc["systems"]}
    if len(doc["categories"]) > 1:
        for name, group in doc["categories"].items():
            lines += [""] + _group_lines(name, group, labels, engine["method"], brief=True)
    lines += [""] + _group_lines("overall", doc["overall"], labels, engine["method"], brief=False)
    identity = doc["identity"]
    if identity.get("reference") == "specc-none" and identity["share"] is not None:
        lines.append(f"  lossless check in {engine['dtype']}: the engine matches "
                     f"{_REFERENCE_NAMES['specc-none']} on {identity['identical']}/{identity['total']} prompts")
    lines += [""] + _memory_lines(doc["memory"], labels)
    if doc.get("bandwidth_bound"):
        lines.append(_bound_line(doc["bandwidth_bound"]))
    lines += [f"note: {note}" for note in doc["notes"]]
    return "\n".join(lines) + "\n"


def _threads_line(machine: dict) -> list[str]:
    """How many threads torch ran with and why (`specc.host.threads`), when the document says."""
    if machine.get("torch_threads") is None:
        return []
    reason = machine.get("torch_threads_reason")
    return [f"{machine['torch_threads']} torch thread(s)" + (f": {reason}" if reason else "")]


def identity_banner(doc: dict) -> str | None:
    if not doc["identity_flag"]:
        return None
    identity = doc["identity"]
    rule = "!" * 78
    shown = ", ".join(f"#{m['prompt_index']} (first difference at token {m['first_difference']})"
                      for m in identity["mismatches"][:8])
    return "\n".join([
        rule,
        f"!! LOSSLESS CHECK FAILED: method {doc['engine']['method']} is lossless, but its output matches",
        f"!! {_REFERENCE_NAMES[identity.get('reference', 'hf-greedy')]} on only {identity['identical']}/"
        f"{identity['total']} prompts ({identity['share']:.1%}).",
        f"!! differing prompts: {shown}",
        *(["!! Compare with the specc-none identity figure: if it also differs, the compiled graph's",
           "!! numerics differ from HF; if not, the speculative method changed the output."]
          if identity.get("reference", "hf-greedy") == "hf-greedy" else
          ["!! In reduced precision the reference is specc's own none engine of the same dtype and",
           "!! backend; the speculative method changed the output."]),
        rule,
    ]) + "\n"


_REFERENCE_NAMES = {"hf-greedy": "HF greedy", "specc-none": "specc none (same dtype and backend)"}


def _group_lines(name: str, group: dict, labels: dict, method: str, brief: bool) -> list[str]:
    width = _name_width(labels[system] for system in group["systems"])
    lines = [f"== {name} ({group['prompts']} prompts) ==",
             f"  {'system':<{width}} {'tok/s median [min-max]':<26} {'engine speedup over it':<24} identical to HF"]
    for system, entry in group["systems"].items():
        speed = _spread(entry["tokens_per_second"], "{:.1f}")
        over = _spread(group["speedup"][system], "{:.2f}x") if system in group["speedup"] else "—"
        same = entry.get("identity_vs_hf_greedy")
        same_text = f"{same['identical']}/{same['total']}" if same else "(reference)"
        agreement = entry.get("agreement_with_engine")
        if agreement:
            same_text += f" (same tokens as the engine on {agreement['identical']}/{agreement['total']})"
        lines.append(f"  {labels[system]:<{width}} {speed:<26} {over:<24} {same_text}")
    engine = group["systems"][ENGINE]
    if "acceptance" in engine:
        lines.append("  " + _acceptance_line(engine["acceptance"]))
        if "branches" in engine:
            lines.append("  " + branches_line(engine["branches"]))
        lines.append("  " + _split_line(engine["time_split"]))
    if not brief:
        lines += ["  " + line for line in _prediction_lines(group["prediction"])]
    return lines


def _name_width(names) -> int:
    """The systems' column: 30 characters, or wider where a name (llama.cpp's) needs it."""
    return max(30, *(len(name) + 1 for name in names))


def _acceptance_line(acc: dict) -> str:
    m = acc["mean_accepted_length"]
    ctar = _figures(acc["ctar"].values())
    by_depth = f"α by depth {_figures(acc['alpha_per_depth'])}  " if acc.get("alpha_per_depth") else ""
    return (f"M {m:.2f} (bonus token counted)  α {_rate(acc.get('step_acceptance_rate'))} per draft step, "
            f"{_rate(acc['acceptance_rate'])} per drafted token  {by_depth}CTAR(1..6) {ctar}  "
            f"[{acc['draft_rounds']} draft rounds]")


def _figures(values) -> str:
    return " ".join("—" if v is None else f"{v:.2f}" for v in values)


def branches_line(branches: dict) -> str:
    """Each branch's share of the accepted tokens and its own acceptance; the shares may add
    up to more than 100%, since a node several branches drafted counts for each."""
    parts = []
    for name, branch in branches["branches"].items():
        share = branch["share_of_accepted"]
        parts.append(f"{name} {'n/a' if share is None else f'{share:.0%}'} "
                     f"(α {_rate(branch['acceptance_rate'])} of {branch['proposed_tokens']} proposed)")
    return (f"branches, share of the {branches['accepted_tokens']} accepted tokens: {', '.join(parts)}  "
            f"(a token several branches drafted counts for each)")


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _split_line(split: dict) -> str:
    parts = "  ".join(f"{k} {'—' if v is None else f'{v:.0%}'}" for k, v in split["share"].items())
    return f"time: {parts}  (of {split['seconds']['wall']:.2f}s generating)"


def _prediction_lines(prediction: dict) -> list[str]:
    measured = prediction["measured"]
    decode = measured["decode_speedup_over_specc_none"]
    lines = [f"measured over specc none: {measured['speedup_over_specc_none']:.2f}x end to end, "
             + ("n/a" if decode is None else f"{decode:.2f}x") + " after prefill (medians over repeats)"]
    swift, s3d = prediction["swift_eq6"], prediction["s3d_eq12"]
    if swift["expected_speedup"] is not None:
        lines.append(f"predicted, SWIFT eq. 6: {swift['expected_speedup']:.2f}x  "
                     f"(M {swift['M']:.2f}, α {swift['alpha']:.3f}, c {swift['c']:.3f})"
                     + ("" if swift.get("with_measured_verify") is None else
                        f"; {swift['with_measured_verify']:.2f}x with the measured verification cost "
                        f"(v {swift['v']:.2f} plain forwards per round)"))
    else:
        lines.append(f"predicted, SWIFT eq. 6: n/a ({swift['reason']})")
    if s3d["improvement_factor"] is not None:
        lines.append(f"predicted, S3D eq. 12:  {s3d['improvement_factor']:.2f}x  "
                     f"(τ {s3d['tau']:.2f} for γ {s3d['gamma']}, β {s3d['beta']:.3f}, δ {s3d['delta']:.3f})")
    else:
        lines.append(f"predicted, S3D eq. 12:  n/a ({s3d['reason']})")
    if prediction.get("compile_time") is not None:
        compile_time = prediction["compile_time"]
        lines.append(f"predicted at compile time: {compile_time['speedup']:.2f}x  ({compile_time['by']})")
    return lines


def _bound_line(bound: dict) -> str:
    decode, weights_only = bound["specc_none_decode_tokens_per_second"], bound.get("weights_only_bound_tokens_per_second")
    return bound_line(bound, "specc none", decode, bound["specc_none_share_of_bound"],
                      bound["specc_none_share_of_bound_range"],
                      decode / weights_only if decode and weights_only else None)


def bound_line(bound: dict, decoder: str, decode_tokens_per_second: float | None, share: float | None,
               share_range: list | None = None, weights_only_share: float | None = None) -> str:
    """One line for a bandwidth bound (`specc.bench.bandwidth.decode_bound`) and how close
    `decoder`'s decoding came to it: `specc bench`'s and benchmarks/engines_side_by_side.py's."""
    reached = "n/a" if share is None else (
        f"{decode_tokens_per_second:.1f} tok/s = {share:.0%} of it" + (_share_range(share_range) if share_range else ""))
    cached = bound.get("kv_cache_bytes_per_token")
    beside = f" ({weights_only_share:.0%} of the weights-only bound)" if cached and weights_only_share else ""
    return (f"bandwidth bound: {bound['weight_bytes_per_token'] / 1e6:.0f} MB of weights{_cache_part(bound)} per "
            f"decode step at {bound['read_bytes_per_second'] / 1e9:.1f} GB/s read"
            f"{_range(bound['read_bytes_per_second_range'], 1e9)} → {bound['bound_tokens_per_second']:.1f} tok/s; "
            f"{decoder} decodes (prefill excluded) {reached}{beside}  ({bound['measured_by']})")


def _cache_part(bound: dict) -> str:
    """" and N MB of cached keys and values (mean)" where the bound counts them (since 2026-12-01)."""
    cache = bound.get("kv_cache_bytes_per_token")
    return f" and {cache / 1e6:.1f} MB of cached keys and values (mean)" if cache else ""


def _range(values: list, scale: float) -> str:
    if values[0] == values[1]:
        return ""
    return f" ({values[0] / scale:.1f}–{values[1] / scale:.1f})"


def _share_range(values: list) -> str:
    if round(values[0], 2) == round(values[1], 2):
        return ""
    return f" ({values[0]:.0%}–{values[1]:.0%} over the read-rate range)"


def _memory_lines(memory: dict, labels: dict) -> list[str]:
    lines = [f"memory ({memory['method']}); process peak {_mib(memory['process_peak_rss_bytes'])}:"]
    width = _name_width(labels[name] for name in memory["systems"])
    for name, entry in memory["systems"].items():
        lines.append(f"  {labels[name]:<{width}} weights {_mib(entry['weights_bytes']):>10}   "
                     f"peak RSS {_mib(entry['peak_rss_bytes']):>10}   growth during a run "
                     f"{_mib(entry['peak_growth_bytes']):>10}")
    normalized = memory.get("memory_normalized_speedup")
    if normalized:
        lines.append(f"  speedup per memory (S3D's M = speedup over specc none / relative memory): "
                     f"{normalized['value']:.2f} ({normalized['speedup_over_specc_none']:.2f}x at "
                     f"{normalized['relative_memory']:.2f}x the memory, weights plus growth during a run)")
    return lines


def _spread(spread: dict, fmt: str) -> str:
    return f"{fmt.format(spread['median'])} [{fmt.format(spread['min'])}-{fmt.format(spread['max'])}]"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"
