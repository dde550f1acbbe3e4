"""Method configs: versions in their JSON, the shared option blocks, and the fields each
built-in method's config keeps (so `--set` and existing manifests stay valid)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from specc.contract.config import VERSION_KEY, ConfigVersionError, MethodConfig, option
from specc.contract.options import CalibrationOptions, DistillationOptions, OptimizerOptions
from specc.errors import UsageError
from specc.methods.draft_model.config import DraftModelConfig
from specc.methods.firp.config import FIRPConfig
from specc.methods.kangaroo.config import KangarooConfig
from specc.methods.none import AutoregressiveConfig
from specc.methods.s3d.config import S3DConfig
from specc.methods.specee.config import SpecEEConfig
from specc.methods.swift.config import SwiftConfig

BUILT_IN = [AutoregressiveConfig, DraftModelConfig, FIRPConfig, KangarooConfig, S3DConfig, SpecEEConfig, SwiftConfig]

# The shared fields each method has, with its default: the option blocks must not add, drop
# or change any of them (a manifest written before the blocks must read the same).
SHARED_DEFAULTS = {
    KangarooConfig: dict(train_steps=3000, train_windows=768, teacher_top_k=64, learning_rate=3e-3,
                         warmup_steps=30, train_seq_len=128, eval_sequences=8, eval_every=50, seed=0,
                         weight_decay=0.0, grad_clip=1.0, calib_data=None),
    SpecEEConfig: dict(train_steps=600, train_windows=128, teacher_top_k=64, learning_rate=3e-3, warmup_steps=30,
                       train_seq_len=128, eval_sequences=8, eval_every=100, seed=0, calib_data=None),
    S3DConfig: dict(train_steps=200, train_windows=64, teacher_top_k=64, learning_rate=2e-3, warmup_steps=30,
                    train_seq_len=128, eval_sequences=8, eval_every=50, seed=0, weight_decay=0.0, grad_clip=1.0,
                    calib_data=None),
    FIRPConfig: dict(train_steps=100, train_windows=32, teacher_top_k=64, learning_rate=3e-3, warmup_steps=10,
                     train_seq_len=128, eval_sequences=4, eval_every=50, seed=0, weight_decay=0.0, grad_clip=1.0,
                     calib_data=None),
    DraftModelConfig: dict(calib_data=None),
    SwiftConfig: dict(calib_data=None),
}
BLOCK_FIELDS = {f for block in (DistillationOptions, OptimizerOptions, CalibrationOptions)
                for f in block.__dataclass_fields__}


@pytest.mark.parametrize("cls", BUILT_IN, ids=lambda c: c.__name__)
def test_json_round_trip_records_the_version(cls):
    config = cls(draft_model="d") if cls is DraftModelConfig else cls()
    data = json.loads(json.dumps(config.to_json()))
    assert next(iter(data)) == VERSION_KEY and data[VERSION_KEY] == cls.VERSION == 1
    assert cls.from_json(data) == config
    assert [k for k in data if k != VERSION_KEY] == [f["name"] for f in cls.describe_fields()]


@pytest.mark.parametrize("cls", list(SHARED_DEFAULTS), ids=lambda c: c.__name__)
def test_shared_fields_keep_each_methods_defaults(cls):
    described = {f["name"]: f for f in cls.describe_fields()}
    shared = {name for name in described if name in BLOCK_FIELDS}
    assert shared == set(SHARED_DEFAULTS[cls])
    assert {name: described[name]["default"] for name in shared} == SHARED_DEFAULTS[cls]
    assert all(described[name]["help"] for name in described), "every field has help, own or the block's"
    # the method's own fields come first, the blocks' after them
    names = list(described)
    assert names[-len(shared):] == [n for n in names if n in shared]


def test_a_manifest_without_a_version_reads_as_version_1():
    old = {"exit_layer": 2, "train_steps": 10, "calib_data": "x.txt"}   # written before configs had versions
    config = KangarooConfig.from_json(old)
    assert (config.exit_layer, config.train_steps, config.calib_data) == (2, 10, "x.txt")
    assert config.to_json()[VERSION_KEY] == 1


def test_a_newer_or_unknown_version_is_refused():
    data = {**KangarooConfig().to_json(), VERSION_KEY: 2}
    with pytest.raises(ConfigVersionError, match=r"KangarooConfig settings record version 2, newer than the "
                                                 r"version this specc reads \(1\)") as caught:
        KangarooConfig.from_json(data)
    assert (caught.value.found, caught.value.expected) == (2, 1) and isinstance(caught.value, UsageError)
    with pytest.raises(UsageError, match="config version must be an integer, got 'two'"):
        KangarooConfig.from_json({VERSION_KEY: "two"})


def test_the_version_cannot_be_set_as_a_field():
    with pytest.raises(UsageError, match="unknown config field"):
        KangarooConfig.from_assignments(["version=2"])
    with pytest.raises(TypeError, match="declares a field 'version'"):
        @dataclass(frozen=True)
        class Clashing(MethodConfig):
            version: int = option(1, "a field that would hide the config's version")


@dataclass(frozen=True)
class Renamed(MethodConfig):
    """Version 2 renamed `steps` to `rounds`; version 1 (or no version) still reads."""

    VERSION = 2
    rounds: int = option(4, "rounds")

    @classmethod
    def upgrade(cls, data, version):
        return {("rounds" if k == "steps" else k): v for k, v in data.items()} if version == 1 else None


@dataclass(frozen=True)
class Changed(MethodConfig):
    """Version 2 changed what `rounds` means and carries nothing over (the default `upgrade`)."""

    VERSION = 2
    rounds: int = option(4, "rounds")


def test_an_older_version_loads_through_upgrade_or_is_refused():
    assert Renamed.from_json({"steps": 7}).rounds == 7                      # no version: version 1
    assert Renamed.from_json({VERSION_KEY: 1, "steps": 7}).rounds == 7
    assert Renamed.from_json({VERSION_KEY: 2, "rounds": 7}).to_json() == {VERSION_KEY: 2, "rounds": 7}
    with pytest.raises(ConfigVersionError, match=r"record no version \(read as version 1\), older than the "
                                                 r"version this specc reads \(2\)"):
        Changed.from_json({"rounds": 7})
    with pytest.raises(ConfigVersionError, match="version 3, newer"):
        Renamed.from_json({VERSION_KEY: 3, "rounds": 7})


def test_blocks_check_their_fields_for_every_method():
    for cls in (KangarooConfig, S3DConfig, FIRPConfig, SpecEEConfig):
        with pytest.raises(UsageError, match="train_steps=-1 must be 0 or more"):
            cls(train_steps=-1)
        with pytest.raises(UsageError, match="eval_every=0 must be at least 1"):
            cls.from_assignments(["eval_every=0"])
    for cls in (KangarooConfig, S3DConfig, FIRPConfig):
        with pytest.raises(UsageError, match="grad_clip=0.0 must be positive"):
            cls(grad_clip=0.0)
    with pytest.raises(UsageError, match="unknown config field.*weight_decay"):
        SpecEEConfig.from_assignments(["weight_decay=0.1"])    # SpecEE exposes no weight decay
    # a method's own, stricter check of a block field wins
    with pytest.raises(UsageError, match="train_seq_len=3 must be at least steps \\+ 2 = 5"):
        FIRPConfig(train_seq_len=3)


def test_a_redeclared_field_keeps_the_blocks_help_unless_it_gives_its_own():
    help_of = {f["name"]: f["help"] for f in S3DConfig.describe_fields()}
    block = {f["name"]: f["help"] for f in KangarooConfig.describe_fields()}
    assert help_of["learning_rate"] == DistillationOptions.__dataclass_fields__["learning_rate"].metadata["help"]
    assert help_of["teacher_top_k"] == block["teacher_top_k"]
    assert "the paper's 5e-5" in block["learning_rate"]                     # Kangaroo's own help
    assert "token frequencies" in {f["name"]: f["help"] for f in DraftModelConfig.describe_fields()}["calib_data"]


def test_an_out_of_tree_config_composes_the_blocks_from_the_extension_module():
    from specc.extension import CalibrationOptions as Calibration, DistillationOptions as Distillation
    from specc.extension import MethodConfig as Base, OptimizerOptions as Optimizer, option as extension_option

    @dataclass(frozen=True)
    class Mine(Base, Distillation, Optimizer, Calibration):
        depth: int = extension_option(4, "tokens drafted per round")
        train_steps: int = extension_option(1000, "adapter training steps")
        warmup_steps: int = extension_option(10)

        def __post_init__(self):
            if self.depth < 1:
                raise UsageError(f"depth={self.depth} must be at least 1")
            super().__post_init__()

    names = [f["name"] for f in Mine.describe_fields()]
    assert names[:2] == ["depth", "train_steps"] and names[-3:] == ["weight_decay", "grad_clip", "calib_data"]
    config = Mine.from_assignments(["depth=2", "learning_rate=1e-3", "calib_data=a.txt"])
    assert Mine.from_json(config.to_json()) == config and config.warmup_steps == 10
    with pytest.raises(UsageError, match="depth=0"):
        Mine(depth=0)
    with pytest.raises(UsageError, match="weight_decay=-1.0 must be 0 or more"):
        Mine(weight_decay=-1.0)


def test_bounds_declared_in_option_are_checked_in_one_place_and_described():
    """`option(..., at_least=, at_most=, above=, below=, choices=)`: checked whichever way a
    config is made, kept by a field a config redeclares, and listed by `describe_fields`."""

    @dataclass(frozen=True)
    class Bounded(MethodConfig, DistillationOptions):
        depth: int = option(4, "tokens per round", at_least=1, at_most=8)
        ratio: float = option(0.5, "a share", at_least=0, below=1)
        mode: str = option("fast", "how", choices=("fast", "slow"))
        train_steps: int = option(10, "steps")   # redeclared without bounds: the block's stay

    allowed = {f["name"]: f["allowed"] for f in Bounded.describe_fields()}
    assert allowed["depth"] == "between 1 and 8" and allowed["ratio"] == "in [0, 1)"
    assert allowed["mode"] == "one of fast, slow" and allowed["train_steps"] == "0 or more"
    assert allowed["seed"] is None
    with pytest.raises(UsageError, match="depth=9 must be between 1 and 8"):
        Bounded.from_assignments(["depth=9"])
    with pytest.raises(UsageError, match="ratio=1.0 must be in \\[0, 1\\)"):
        Bounded.from_json({"ratio": 1.0})
    with pytest.raises(UsageError, match="mode='medium' must be one of fast, slow"):
        Bounded(mode="medium")
    with pytest.raises(UsageError, match="train_steps=-1 must be 0 or more"):
        Bounded(train_steps=-1)


def test_specc_methods_prints_each_fields_allowed_values(capsys):
    from specc.cli.main import main

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "depth: int = 6 (between 1 and 16)" in out and "mode: str = 'lossless' (one of lossless, ar, tree)" in out
