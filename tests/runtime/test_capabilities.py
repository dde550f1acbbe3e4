"""Capabilities: what a target or drafter can do beyond its protocol is declared on its class and
read as declared (`specc.contract.drafter.Capabilities`), never probed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specc.contract.drafter import Capabilities, MethodRuntime
from specc.errors import SpeccError
from specc.runtime.method_report import method_report
from specc.runtime.ngram import NgramDrafter


class Undeclared:
    def begin(self, prompt, prefill) -> None: ...
    def propose(self, tokens, budget, sampling, generator): ...
    def observe(self, draft, acceptance, verification) -> None: ...


TARGET = SimpleNamespace(capabilities=Capabilities(resumable=True))


def test_a_runtime_refuses_a_drafter_that_declares_no_capabilities():
    with pytest.raises(SpeccError, match="drafter Undeclared declares no capabilities.*Capabilities\\("):
        MethodRuntime(TARGET, Undeclared())
    with pytest.raises(SpeccError, match="target Undeclared"):
        MethodRuntime(Undeclared())


def test_the_method_report_comes_from_the_part_that_declares_one():
    reporting = SimpleNamespace(capabilities=Capabilities(reports=True), method_report=lambda: {"exits": 3})
    silent = SimpleNamespace(capabilities=Capabilities(), method_report=lambda: {"unasked": True})
    assert method_report(MethodRuntime(reporting, NgramDrafter(2, 1, 4))) == {"exits": 3}
    assert method_report(MethodRuntime(silent)) == {}
    assert method_report(MethodRuntime(TARGET, silent)) == {}
