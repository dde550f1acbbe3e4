"""Engine round-trip, integrity checks and atomic writing."""

from __future__ import annotations

import json
import zipfile

import pytest

from specc.compiler import CompileRequest, compile_engine
from specc.engine.format import FORMAT_VERSION, MANIFEST
from specc.engine.loaded import load_engine
from specc.errors import SpeccError, UsageError
from specc.kernels import KERNELS
from specc.testing.checkpoints import build_tiny_checkpoint


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    checkpoint = build_tiny_checkpoint("llama", root / "model")
    compile_engine(CompileRequest(model=str(checkpoint), method="none", output=root / "engine", max_seq_len=64))
    return root / "engine"


def copy_engine(engine_dir, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(engine_dir, target)
    return target


def test_manifest_records_versions_passes_and_checksums(engine_dir):
    manifest = json.loads((engine_dir / MANIFEST).read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert set(manifest["versions"]) == {"specc", "torch", "transformers"}
    assert [p["pass_name"] for p in manifest["passes"]] == [
        "expose_position_ids", "insert_attention_mask", "insert_kv_cache", "window_sliding_layers",
        "select_logit_rows"]
    assert manifest["graphs"]["target"]["architecture"]["model_type"] == "llama"
    files = set(manifest["files"])
    assert {"graphs/target.json", "weights/target.safetensors", "tokenizer/tokenizer.json"} <= files
    assert any(f.startswith("ir/target/") for f in files)


def test_engine_contains_no_pickle(engine_dir):
    for path in engine_dir.rglob("*"):
        if path.is_file():
            head = path.read_bytes()[:2]
            assert head != b"\x80\x04" and head != b"\x80\x02", f"{path} looks like a pickle"
            assert not zipfile.is_zipfile(path) or path.suffix == ".pt2", f"{path} is a zip (torch.save?)"
            assert path.suffix not in (".pt", ".pth", ".bin", ".pkl")


def test_round_trip_generates(engine_dir):
    engine = load_engine(engine_dir)
    result = engine.generate_ids([5, 6, 7], 5)
    assert len(result.token_ids) >= 1 and result.stats.new_tokens == len(result.token_ids)


def test_tampered_file_is_refused(engine_dir, tmp_path):
    engine = copy_engine(engine_dir, tmp_path)
    graph = engine / "graphs" / "target.json"
    graph.write_text(graph.read_text().replace("aten.linear", "aten.linear", 1) + " ")
    with pytest.raises(SpeccError, match="checksum mismatch for graphs/target.json"):
        load_engine(engine)


def test_incomplete_engine_is_refused(engine_dir, tmp_path):
    engine = copy_engine(engine_dir, tmp_path)
    (engine / "weights" / "target.safetensors").unlink()
    with pytest.raises(SpeccError, match="incomplete: weights/target.safetensors is missing"):
        load_engine(engine)
    (engine / MANIFEST).unlink()
    with pytest.raises(SpeccError, match="no manifest.json"):
        load_engine(engine)


def test_newer_format_is_refused(engine_dir, tmp_path):
    engine = copy_engine(engine_dir, tmp_path)
    manifest = json.loads((engine / MANIFEST).read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (engine / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SpeccError, match="newer than this specc reads"):
        load_engine(engine)


def _with_kernels(engine_dir, tmp_path, **entries):
    engine = copy_engine(engine_dir, tmp_path)
    manifest = json.loads((engine / MANIFEST).read_text())
    (engine / MANIFEST).write_text(json.dumps({**manifest, **entries}))
    return engine


def test_engine_compiled_against_another_kernel_revision_is_refused(engine_dir, tmp_path):
    current = KERNELS["row_attention"].revision
    assert current > 1   # its output layout changed once: engines from before must be recompiled
    before_revisions = _with_kernels(engine_dir, tmp_path / "a", kernels={"target": ["row_attention"]})
    with pytest.raises(SpeccError, match=f"revision 1 of the specc kernel 'row_attention'; this specc has "
                                         f"revision {current} \\(its output"):
        load_engine(before_revisions)
    current_engine = _with_kernels(engine_dir, tmp_path / "b", kernels={"target": ["row_attention"]},
                                   kernel_revisions={"row_attention": current})
    assert load_engine(current_engine).manifest["kernel_revisions"] == {"row_attention": current}


def test_engine_calling_a_kernel_this_specc_lacks_is_refused(engine_dir, tmp_path):
    engine = _with_kernels(engine_dir, tmp_path, kernels={"target": ["warp_drive"]})
    with pytest.raises(SpeccError, match="calls the specc kernel 'warp_drive', which this specc does not have"):
        load_engine(engine)


def _with_method_config(engine_dir, tmp_path, method_config):
    engine = copy_engine(engine_dir, tmp_path)
    manifest = json.loads((engine / MANIFEST).read_text())
    manifest["method_config"] = method_config
    (engine / MANIFEST).write_text(json.dumps(manifest))
    return engine, manifest


def test_manifest_records_the_method_config_version(engine_dir):
    manifest = json.loads((engine_dir / MANIFEST).read_text())
    assert manifest["method_config"] == {"version": 1}


def test_engine_whose_config_records_no_version_still_loads(engine_dir, tmp_path):
    engine, _ = _with_method_config(engine_dir, tmp_path, {})    # as specc wrote it before configs had versions
    assert load_engine(engine).config.to_json() == {"version": 1}


def test_engine_with_an_unreadable_config_version_is_refused_with_the_recompile_command(engine_dir, tmp_path):
    engine, manifest = _with_method_config(engine_dir, tmp_path, {"version": 2})
    with pytest.raises(UsageError) as caught:
        load_engine(engine)
    message = str(caught.value)
    assert f"engine {engine} was compiled with none config version 2 (this specc reads version 1)" in message
    assert (f"recompile it with `specc compile {manifest['source_checkpoint']} --method none --backend eager "
            f"--dtype float32 --max-seq-len 64 -o {engine} --force`") in message
    assert f"or load it with the specc that wrote it ({manifest['versions']['specc']})" in message


def test_engine_whose_versionless_config_no_longer_parses_is_refused(engine_dir, tmp_path):
    engine, _ = _with_method_config(engine_dir, tmp_path, {"dropped_field": 3})
    with pytest.raises(UsageError, match=r"its none settings \(recorded without a version\) do not fit this "
                                         r"specc's none config \(unknown config field\(s\) dropped_field.*\): "
                                         r"recompile it with `specc compile "):
        load_engine(engine)


def test_graph_naming_a_foreign_callable_is_refused(engine_dir, tmp_path):
    from specc.graph.serialize import graph_from_json

    data = json.loads((engine_dir / "graphs" / "target.json").read_text())
    node = next(n for n in data["nodes"] if n["op"] == "call_function")
    node["target"] = "os.system"
    with pytest.raises(SpeccError, match="refusing to load it"):
        graph_from_json(data, {})


def test_existing_output_needs_force_and_failure_leaves_nothing(engine_dir, tmp_path):
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model")
    out = tmp_path / "engine"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists; pass --force"):
        compile_engine(CompileRequest(model=str(checkpoint), method="none", output=out))
    with pytest.raises(SpeccError):
        compile_engine(CompileRequest(model=str(checkpoint), method="none", output=out, force=True,
                                      settings=["bogus=1"]))
    assert (out / "keep.txt").read_text() == "mine", "a failed compile must not touch the old engine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine", "model"], "no partial directories left"
    compile_engine(CompileRequest(model=str(checkpoint), method="none", output=out, force=True, max_seq_len=32))
    assert not (out / "keep.txt").exists() and (out / MANIFEST).is_file()


def test_missing_parent_directories_are_created(tmp_path):
    checkpoint = build_tiny_checkpoint("llama", tmp_path / "model")
    out = tmp_path / "engines" / "nested" / "tiny"
    compile_engine(CompileRequest(model=str(checkpoint), method="none", output=out, max_seq_len=32))
    assert (out / MANIFEST).is_file()
