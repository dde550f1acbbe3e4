"""A side channel is taken back by its type; another method's record is named, not misread."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from specc.contract.drafter import Draft
from specc.contract.side_channel import SideChannel, carried
from specc.contract.tree import TreeSpec, tree_tensors
from specc.contract.verification import Verification
from specc.errors import SpeccError


@dataclass(frozen=True)
class Exits(SideChannel):
    states: torch.Tensor


@dataclass(frozen=True)
class Candidates(SideChannel):
    ids: torch.Tensor


def chain_draft(carries=None) -> Draft:
    return Draft(tree=tree_tensors(TreeSpec.chain(1)), node_tokens=torch.tensor([1, 2]), carries=carries)


def test_a_reader_gets_back_the_record_of_its_type():
    exits = Exits(torch.ones(2, 4))
    assert carried(chain_draft(exits), Exits) is exits
    assert carried(Verification(torch.zeros(2, 8), carries=exits), Exits) is exits


def test_nothing_carried_reads_as_none():
    assert carried(chain_draft(), Exits) is None
    assert carried(Verification(torch.zeros(2, 8)), Exits) is None


def test_another_methods_record_is_an_error_naming_both_types():
    with pytest.raises(SpeccError, match="Draft carries a Candidates.*expects a Exits"):
        carried(chain_draft(Candidates(torch.zeros(2, 3))), Exits)
