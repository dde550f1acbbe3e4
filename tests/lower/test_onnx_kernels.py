"""`--kernels --backend onnx`: specc.tree_attention is exported through its onnxscript
translation (`specc.lower.onnx_kernels`), and the engine reproduces Hugging Face greedy."""

from __future__ import annotations

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.engine.loaded import load_engine
from specc.lower.onnx_session import OnnxSessionGraph
from specc.testing.checkpoints import assert_matches_hf_greedy, varied_prompts

onnx = pytest.importorskip("onnx", reason="the onnx backend needs pip install 'specc[onnx]'")
pytest.importorskip("onnxruntime", reason="the onnx backend needs pip install 'specc[onnx]'")

MAX_NEW_TOKENS = 24


def test_kernels_engine_exports_tree_attention_and_matches_hf_greedy(checkpoints, tmp_path):
    target, _ = checkpoints("llama")   # 4 heads over 2 kv heads: the translation repeats kv per group
    report = compile_engine(CompileRequest(model=str(target), method="none", output=tmp_path / "engine",
                                           backend="onnx", max_seq_len=96, kernels=True))
    assert report["kernels"] == {"target": ["tree_attention"]}
    graph = onnx.load(str(tmp_path / "engine" / "compiled" / "target.onnx"), load_external_data=False)
    nodes = [*graph.graph.node, *(n for f in graph.functions for n in f.node)]
    assert not [n.op_type for n in nodes if n.domain.startswith("specc")], "no specc op may reach onnxruntime"
    assert any(n.op_type == "Softmax" for n in nodes)

    engine = load_engine(tmp_path / "engine")
    assert isinstance(engine.context.graphs["target"], OnnxSessionGraph)
    assert_matches_hf_greedy(lambda ids: engine.generate_ids(ids, MAX_NEW_TOKENS), target,
                             varied_prompts(12, 96, seed=11), MAX_NEW_TOKENS)
