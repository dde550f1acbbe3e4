"""The benchmark document's schema, the identity flag, the report and the chart,
from interleaved runs of fake systems (no models)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from specc.bench.bandwidth import BandwidthSamples, decode_bound, decode_read_bytes, read_bandwidth
from specc.bench.document import SCHEMA, build_document
from specc.bench.memory import MemoryProbe
from specc.bench.plot import write_chart
from specc.bench.report import format_report, identity_banner
from specc.bench.runner import run_interleaved
from specc.bench.systems import ENGINE, HF_GREEDY, HF_PROMPT_LOOKUP, SPECC_NONE, System
from specc.runtime.stats import GenerationStats

PROMPTS = [[1, 5, 6], [1, 7], [1, 8, 9, 10]]
CATEGORIES = ["code", "math", "code"]


def _greedy(prompt_ids):
    return [(t * 7) % 50 + 4 for t in prompt_ids] + [11, 12, 13]


def _plain(prompt_ids):
    out = _greedy(prompt_ids)
    return out, GenerationStats(new_tokens=len(out), target_forward_passes=len(out), verify_seconds=1e-3 * len(out),
                                prefill_seconds=1e-3, wall_seconds=2e-3 * len(out))


def _speculative(corrupt_prompt: int | None):
    def generate(prompt_ids):
        out = _greedy(prompt_ids)
        if corrupt_prompt is not None and prompt_ids == PROMPTS[corrupt_prompt]:
            out = out[:2] + [99] + out[3:]
        rounds = [2, 1, 0]
        stats = GenerationStats(new_tokens=len(out), target_forward_passes=len(out) - sum(rounds),
                                drafted_tokens=6, accepted_tokens=sum(rounds), accepted_per_round=rounds,
                                draft_steps_per_round=[2, 2, 2],
                                draft_seconds=1e-3, verify_seconds=1e-3, prefill_seconds=1e-3, wall_seconds=4e-3)
        return out, stats
    return generate


def _hf_rounding_differently(prompt_ids):
    out = _greedy(prompt_ids)
    return (out[:1] + [98] + out[2:] if prompt_ids == PROMPTS[0] else out), None


def _document(corrupt_prompt=None, lossless=True, method_state=None, bandwidth_bound=None, dtype="float32",
              hf=lambda ids: (_greedy(ids), None)):
    systems = [
        System(HF_GREEDY, "HF generate, greedy", "baseline", hf, 100),
        System(HF_PROMPT_LOOKUP, "HF prompt lookup (10)", "baseline", lambda ids: (_greedy(ids), None), 100),
        System(SPECC_NONE, "specc none", "baseline", _plain, 100),
        System(ENGINE, "specc fake", "engine", _speculative(corrupt_prompt), 120),
    ]
    memory = MemoryProbe()
    runs = run_interleaved(systems, PROMPTS, repeats=3, memory=memory, show_progress=False)
    prompts = [{"index": i, "category": c, "prompt_tokens": len(p), "preview": "x"}
               for i, (p, c) in enumerate(zip(PROMPTS, CATEGORIES))]
    manifest = {"method": "draft-model", "method_config": {"draft_model": "d", "num_draft_tokens": 2},
                "lossless": lossless,
                "backend": "eager", "dtype": dtype, "max_seq_len": 64, "graphs": {"target": {}},
                **({"method_state": method_state} if method_state else {})}
    return build_document(
        engine_manifest=manifest, engine_path="/engines/fake",
        machine={"cpu_count": 2, "torch_threads": 2, "torch_threads_reason": "2 cores, busy now 0.1 (other processes)"},
        versions={"torch": "x"},
        model_info={"checkpoint": "/ckpt", "model_type": "llama", "parameters": 1000},
        settings={"prompt_set": "test", "num_prompts": 3, "max_new_tokens": 8, "repeats": 3},
        prompts=prompts, systems=systems, runs=runs, memory=memory, notes=["a note"], bandwidth_bound=bandwidth_bound,
    )


def test_runs_are_interleaved_with_one_warm_up_each():
    calls = []
    systems = [System(name, name, "baseline", lambda ids, n=name: calls.append(n) or ([4], None), 0)
               for name in ("a", "b")]
    runs = run_interleaved(systems, [[1], [2]], repeats=2, memory=MemoryProbe(), show_progress=False)
    assert calls[:2] == ["a", "b"]                        # warm-ups, not recorded
    assert len(runs) == 8 and calls[2:] == ["a", "b", "b", "a", "b", "a", "a", "b"]
    assert [(r.repeat, r.prompt_index) for r in runs[:4]] == [(0, 0), (0, 0), (0, 1), (0, 1)]


def test_document_schema():
    doc = _document()
    assert doc["schema"] == SCHEMA
    assert set(doc) >= {"machine", "versions", "model", "engine", "settings", "notes", "prompts", "systems",
                        "overall", "categories", "memory", "identity", "identity_flag", "runs"}
    assert set(doc["categories"]) == {"code", "math"} and doc["categories"]["code"]["prompts"] == 2
    overall = doc["overall"]
    assert set(overall["speedup"]) == {HF_GREEDY, HF_PROMPT_LOOKUP, SPECC_NONE}
    for spread in overall["speedup"].values():
        assert set(spread) == {"median", "min", "max", "n"} and spread["n"] == 3
        assert spread["min"] <= spread["median"] <= spread["max"]
    engine = overall["systems"][ENGINE]
    assert engine["acceptance"]["mean_accepted_length"] == pytest.approx(6 / 3)   # every prompt: 6 new, 3 forwards
    assert engine["acceptance"]["acceptance_rate"] == pytest.approx(0.5)
    assert engine["acceptance"]["ctar"]["1"] == pytest.approx(2 / 3)
    assert engine["acceptance"]["alpha_per_depth"] == pytest.approx([2 / 3, 1 / 2])   # chains of 2: [2, 1, 0]
    assert "branches" not in engine    # no method report, no branch shares
    assert set(engine["time_split"]["share"]) == {"draft", "verify", "prefill", "other"}
    assert set(overall["prediction"]) >= {"swift_eq6", "s3d_eq12", "measured", "target_forward_seconds"}
    assert set(doc["memory"]["systems"]) == {HF_GREEDY, HF_PROMPT_LOOKUP, SPECC_NONE, ENGINE}
    assert len(doc["runs"]) == 3 * 3 * 4
    assert doc["identity"]["share"] == 1.0 and doc["identity_flag"] is False
    json.dumps(doc)   # every figure is plain JSON


def test_a_lossless_engine_that_differs_is_flagged():
    doc = _document(corrupt_prompt=1)
    assert doc["identity_flag"] is True
    assert doc["identity"]["mismatches"] == [{"prompt_index": 1, "first_difference": 2}]
    assert doc["categories"]["math"]["systems"][ENGINE]["identity_vs_hf_greedy"]["share"] == 0.0
    banner = identity_banner(doc)
    assert "LOSSLESS CHECK FAILED" in banner and "2/3" in banner and "#1" in banner
    assert identity_banner(_document()) is None


def test_a_lossy_engine_is_not_flagged():
    doc = _document(corrupt_prompt=1, lossless=False)
    assert doc["identity_flag"] is False and doc["identity"]["share"] == pytest.approx(2 / 3)


def test_report_and_chart(tmp_path):
    doc = _document()
    text = format_report(doc)
    for expected in ("== code (2 prompts) ==", "== overall (3 prompts) ==", "HF generate, greedy", "CTAR(1..6)",
                     "predicted, SWIFT eq. 6", "predicted, S3D eq. 12", "measured over specc none",
                     "memory (", "note: a note", "α by depth 0.67 0.50  CTAR",
                     "2 torch thread(s): 2 cores, busy now 0.1 (other processes)"):
        assert expected in text
    assert "branches" not in text
    chart = tmp_path / "chart.png"
    write_chart(doc, chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _composed(report_calls: list):
    """A fake engine with a composed drafter: every generation counts one round per prompt token,
    and its method report (taken after each run and after the warm-up) starts them again."""
    counted = {"rounds": 0}

    def generate(prompt_ids):
        counted["rounds"] += len(prompt_ids)
        return _speculative(None)(prompt_ids)

    def take_method_report():
        rounds, counted["rounds"] = counted["rounds"], 0
        report_calls.append(rounds)
        branch = {"accepted_tokens": rounds, "proposed_tokens": 4 * rounds, "rounds_chosen": rounds,
                  "rounds_drafted": rounds}
        return {"branches": {"eagle": branch, "lookup": {**branch, "accepted_tokens": 0}}, "accepted_tokens": rounds}
    return System(ENGINE, "specc composed", "engine", generate, 120, take_method_report=take_method_report)


def test_branch_shares_are_summed_over_timed_runs_and_printed():
    calls = []
    systems = [System(HF_GREEDY, "HF generate, greedy", "baseline", lambda ids: (_greedy(ids), None), 100),
               System(SPECC_NONE, "specc none", "baseline", _plain, 100), _composed(calls)]
    runs = run_interleaved(systems, PROMPTS, repeats=2, memory=MemoryProbe(), show_progress=False)
    assert calls[0] == len(PROMPTS[0]) and len(calls) == 1 + 2 * len(PROMPTS)   # the warm-up's, discarded
    assert [r.method_report for r in runs if r.system == HF_GREEDY] == [None] * len(PROMPTS) * 2
    engine_runs = [r for r in runs if r.system == ENGINE]
    assert [r.method_report["accepted_tokens"] for r in engine_runs] == [len(PROMPTS[r.prompt_index]) for r in engine_runs]
    prompts = [{"index": i, "category": c, "prompt_tokens": len(p), "preview": "x"}
               for i, (p, c) in enumerate(zip(PROMPTS, CATEGORIES))]
    doc = build_document(
        engine_manifest={"method": "eagle", "method_config": {}, "lossless": True, "backend": "eager",
                         "dtype": "float32", "max_seq_len": 64, "graphs": {"target": {}}},
        engine_path="/engines/fake", machine={}, versions={}, model_info={"checkpoint": "/c", "model_type": "llama",
                                                                          "parameters": 1000},
        settings={"prompt_set": "test", "num_prompts": 3, "max_new_tokens": 8, "repeats": 2},
        prompts=prompts, systems=systems, runs=runs, memory=MemoryProbe(), notes=[])
    branches = doc["overall"]["systems"][ENGINE]["branches"]
    assert branches["accepted_tokens"] == 2 * sum(len(p) for p in PROMPTS) == 18 and branches["runs"] == 6
    assert branches["branches"]["eagle"]["share_of_accepted"] == 1.0
    assert branches["branches"]["lookup"]["share_of_accepted"] == 0.0
    assert doc["categories"]["math"]["systems"][ENGINE]["branches"]["accepted_tokens"] == 2 * len(PROMPTS[1])
    assert "branches" not in doc["overall"]["systems"][SPECC_NONE]
    assert all((run["method_report"] is not None) == (run["system"] == ENGINE) for run in doc["runs"])
    text = format_report(doc)
    assert ("branches, share of the 18 accepted tokens: eagle 100% (α 0.250 of 72 proposed), "
            "lookup 0% (α 0.000 of 72 proposed)  (a token several branches drafted counts for each)") in text
    assert text.count("branches, share of") == 3   # each category and overall


def test_bench_exits_3_when_a_lossless_engine_differs_from_hf(monkeypatch, tmp_path, capsys):
    import specc.bench.command as command
    from specc.cli.main import main

    monkeypatch.setattr(command, "benchmark", lambda options: _document(corrupt_prompt=1))
    out_json = tmp_path / "bench.json"
    code = main(["bench", str(tmp_path), "--json", str(out_json)])
    assert code == command.LOSSLESS_CHECK_FAILED == 3
    assert "LOSSLESS CHECK FAILED" in capsys.readouterr().err
    assert json.loads(out_json.read_text())["identity_flag"] is True     # the evidence is still written


def test_a_compile_time_prediction_is_reported_beside_the_measurement():
    assert "predicted at compile time" not in format_report(_document())
    doc = _document(method_state={"compile_time_prediction": {"speedup": 1.37, "by": "a model"}})
    assert doc["overall"]["prediction"]["compile_time"] == {"speedup": 1.37, "by": "a model"}
    assert "predicted at compile time: 1.37x  (a model)" in format_report(doc)


def test_the_bandwidth_bound_is_reported_with_the_share_none_reaches():
    bandwidth = read_bandwidth(buffer_bytes=8 * 2**20, passes=2, warmup_seconds=0.01)
    assert bandwidth > 1e8
    bound = decode_bound(2000, [4000.0])
    assert bound["weight_bytes_per_token"] == 2000 and bound["bound_tokens_per_second"] == 2.0
    doc = _document(bandwidth_bound=bound)
    none_decode = doc["overall"]["systems"][SPECC_NONE]["decode_tokens_per_second"]["median"]
    assert doc["bandwidth_bound"]["specc_none_share_of_bound"] == pytest.approx(none_decode / 2.0)
    assert "bandwidth bound: 0 MB of weights per decode step" in format_report(doc)
    assert _document()["bandwidth_bound"] is None and "bandwidth bound" not in format_report(_document())


def _embedded(tied: bool) -> torch.fx.GraphModule:
    """A table looked up by row and, tied, read whole as the head; else a separate head beside it."""
    aten, root, graph = torch.ops.aten, torch.nn.Module(), torch.fx.Graph()
    root.table, root.norm = torch.nn.Parameter(torch.randn(10, 4)), torch.nn.Parameter(torch.ones(4))
    root.head = root.table if tied else torch.nn.Parameter(torch.randn(10, 4, dtype=torch.bfloat16))
    hidden = graph.call_function(aten.embedding.default, (graph.get_attr("table"), graph.placeholder("ids")))
    hidden = graph.call_function(aten.mul.Tensor, (hidden, graph.get_attr("norm")))
    graph.output(graph.call_function(aten.linear.default, (hidden, graph.get_attr("head"))))
    return torch.fx.GraphModule(root, graph)


@pytest.mark.parametrize("tied", [True, False])
def test_a_step_reads_every_held_tensor_once_but_a_table_it_only_looks_rows_up_in(tied):
    table, norm, head = 10 * 4 * 4, 4 * 4, 10 * 4 * 2
    assert decode_read_bytes(_embedded(tied)) == (table + norm if tied else norm + head)


def test_a_quantized_graph_s_step_reads_its_packed_weights():
    from specc.passes.quantize_linear_weights import QuantizeLinearWeights
    from specc.quantize.report import quantized_weights
    from specc.quantize.schemes import parse_scheme
    from specc.testing.checkpoints import captured_tiny

    _, captured = captured_tiny("llama")
    plain = captured.graph_module
    quantized = QuantizeLinearWeights(parse_scheme("int8"))(copy.deepcopy(plain)).graph_module
    packed = sum(nbytes for _, nbytes, _ in quantized_weights(quantized).values())
    unpacked = sum(original for _, _, original in quantized_weights(quantized).values())
    assert decode_read_bytes(quantized) == decode_read_bytes(plain) - unpacked + packed


def test_in_reduced_precision_losslessness_is_identity_with_specc_none():
    """HF rounds differently from a compiled graph in bfloat16: not a lossless failure."""
    doc = _document(dtype="bfloat16", hf=_hf_rounding_differently)
    assert doc["overall"]["systems"][ENGINE]["identity_vs_hf_greedy"]["share"] == pytest.approx(2 / 3)
    assert doc["identity"]["reference"] == SPECC_NONE and doc["identity"]["share"] == 1.0
    assert doc["identity_flag"] is False and "matches specc none (same dtype and backend) on 3/3" in format_report(doc)
    broken = _document(dtype="bfloat16", hf=_hf_rounding_differently, corrupt_prompt=2)
    assert broken["identity_flag"] is True and "specc none (same dtype and backend) on only 2/3" in identity_banner(broken)
    assert _document(hf=_hf_rounding_differently)["identity_flag"] is True   # float32 still answers to HF


def test_speedup_per_memory_divides_the_speedup_by_the_relative_footprint():
    doc = _document()
    memory = doc["memory"]
    engine, none = memory["systems"][ENGINE], memory["systems"][SPECC_NONE]
    if engine["peak_growth_bytes"] is None:
        pytest.skip("no per-run RSS peak on this platform")
    relative = (engine["weights_bytes"] + max(0, engine["peak_growth_bytes"])) / \
        (none["weights_bytes"] + max(0, none["peak_growth_bytes"]))
    normalized = memory["memory_normalized_speedup"]
    assert normalized["relative_memory"] == pytest.approx(relative)
    assert normalized["value"] == pytest.approx(doc["overall"]["speedup"][SPECC_NONE]["median"] / relative)
    assert "speedup per memory" in format_report(doc)


def test_the_bound_is_the_median_of_samples_taken_between_repeats_with_its_range():
    readings = iter([3000.0, 9000.0, 4000.0])
    samples = BandwidthSamples(read=lambda: next(readings))
    systems = [System(SPECC_NONE, "specc none", "baseline", _plain, 100)]
    run_interleaved(systems, [[1], [2]], repeats=2, memory=MemoryProbe(), show_progress=False,
                    between_repeats=samples)
    assert samples.values == [3000.0, 9000.0, 4000.0]          # before each repeat and after the last
    bound = samples.bound(2000)
    assert bound["read_bytes_per_second"] == 4000 and bound["read_bytes_per_second_range"] == [3000, 9000]
    assert bound["bound_tokens_per_second"] == 2.0 and bound["bound_tokens_per_second_range"] == [1.5, 4.5]
    doc = _document(bandwidth_bound=bound)
    decode = doc["overall"]["systems"][SPECC_NONE]["decode_tokens_per_second"]["median"]
    assert doc["bandwidth_bound"]["specc_none_share_of_bound_range"] == pytest.approx([decode / 4.5, decode / 1.5])
    report = format_report(doc)
    assert "GB/s read (0.0–0.0) → 2.0 tok/s" in report and "% over the read-rate range)" in report
    assert "over the read-rate range" not in format_report(_document(bandwidth_bound=decode_bound(2000, [4e3])))


def test_the_bound_counts_the_cached_keys_and_values_a_decode_step_attends_to():
    """After a 3-token prompt, new token 1 comes from a step over 4 positions, token 2 over 5:
    the prefill's token reads no cache in a decode step."""
    from specc.bench.bandwidth import CacheLayout, kv_cache_read_bytes, positions_attended
    from specc.bench.runner import Run

    assert positions_attended([(3, 3)]) == [4, 5] and positions_attended([(3, 1)]) == []
    assert positions_attended([(3, 3), (10, 2)]) == [4, 5, 11]
    runs = [Run(SPECC_NONE, 0, 0, 1.0, [7, 8, 9], None), Run(ENGINE, 1, 0, 1.0, [7] * 50, None)]
    assert kv_cache_read_bytes(CacheLayout(50, (None, None)), runs, SPECC_NONE, [[1, 2, 3], [4]]) == 450.0
    bound = decode_bound(2000, [4000.0], kv_cache_bytes=2000)
    assert bound["bound_tokens_per_second"] == 1.0 and bound["weights_only_bound_tokens_per_second"] == 2.0
    assert "2000 MB" not in format_report(_document(bandwidth_bound=bound))
    assert "0 MB of weights and 0.0 MB of cached keys and values (mean) per decode step" in format_report(
        _document(bandwidth_bound=bound))


def test_a_sliding_window_layer_reads_only_the_positions_in_its_window():
    from specc.bench.bandwidth import CacheLayout

    layout = CacheLayout(10, (None, 4, 4))
    assert layout.step_bytes(3) == 3 * 10 * 3
    assert layout.step_bytes(100) == 10 * (100 + 4 + 4)


def test_a_position_holds_a_key_and_a_value_per_layer_and_kv_head_and_windows_come_from_the_graph():
    from types import SimpleNamespace

    import torch.fx as fx

    from specc.bench.bandwidth import cache_layout
    from specc.graph.nodes import ATTENTION_WINDOW
    from specc.graph.signature import CACHE_ROLE

    signature = SimpleNamespace(inputs_with_role=lambda role: [object()] * 6 if role == CACHE_ROLE else [])
    graph = fx.Graph()
    x = graph.placeholder("x")
    for window in (None, 512, None):   # a graph tags the attention calls of its sliding layers
        node = graph.call_function(torch.relu, (x,))
        if window:
            node.meta[ATTENTION_WINDOW] = window
    graph.output(x)
    module = fx.GraphModule(torch.nn.Module(), graph)

    def context(sliding_window):
        architecture = SimpleNamespace(num_key_value_heads=3, head_dim=64, sliding_window=sliding_window)
        return SimpleNamespace(signatures={"target": signature}, architectures={"target": architecture},
                               dtype=torch.bfloat16, modules={"target": module})

    layout = cache_layout(context(None), "target")
    assert layout.bytes_per_layer_position == 2 * 3 * 64 * 2 and layout.windows == (512, None, None)
    assert cache_layout(context(4096), "target").windows == (4096,) * 3   # one window for every layer


