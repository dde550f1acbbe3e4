"""The Python API passes method settings through typed: no detour through key=value text."""

from __future__ import annotations

import pytest

from specc.compiler import CompileRequest, validate
from specc.errors import UsageError


def _request(checkpoint, tmp_path, settings) -> CompileRequest:
    return CompileRequest(model=str(checkpoint), method="kangaroo", output=tmp_path / "e", settings=settings,
                          device="cpu")


def test_typed_settings_reach_the_config_as_given(checkpoints, tmp_path):
    _, _, config, _ = validate(_request(checkpoints("llama")[0], tmp_path,
                                        {"train_steps": 7, "adapter_mlp": False, "exit_threshold": 0.25}))
    assert (config.train_steps, config.adapter_mlp, config.exit_threshold) == (7, False, 0.25)


def test_command_line_assignments_still_parse(checkpoints, tmp_path):
    _, _, config, _ = validate(_request(checkpoints("llama")[0], tmp_path, ["train_steps=7", "adapter_mlp=false"]))
    assert (config.train_steps, config.adapter_mlp) == (7, False)


@pytest.mark.parametrize("settings, message", [
    ({"train_steps": "many"}, "train_steps must be int"),
    ({"gamma": 3}, "unknown config field"),
])
def test_bad_typed_settings_are_usage_errors(checkpoints, tmp_path, settings, message):
    with pytest.raises(UsageError, match=message):
        validate(_request(checkpoints("llama")[0], tmp_path, settings))
