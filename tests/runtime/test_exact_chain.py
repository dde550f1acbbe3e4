"""Under an exactness cap a draft is verified as a chain inside one key block."""

from __future__ import annotations

import pytest
import torch

from specc.contract.drafter import Draft
from specc.contract.side_channel import SideChannel
from specc.contract.tree import TreeSpec, tree_tensors
from specc.errors import SpeccError
from specc.runtime.exact_chain import exact_chain
from specc.runtime.masks import KEY_BLOCK, rows_in_key_block


def test_rows_must_end_in_the_key_block_their_first_row_ends_in():
    assert KEY_BLOCK == 64
    assert rows_in_key_block(0, 1024) == 64
    assert rows_in_key_block(61, 1024) == 3
    assert rows_in_key_block(63, 1024) == 1, "the root alone: 64 keys for it, 128 for any row after it"
    assert rows_in_key_block(64, 1024) == 64
    assert rows_in_key_block(1000, 1024) == 24, "the last block is cut at max_seq_len, the same for every call"
    assert rows_in_key_block(70, 100) == 30


def test_a_tree_keeps_its_root_and_the_first_node_of_each_depth():
    tree = tree_tensors(TreeSpec((2, 1, 3)))   # nodes: root 0; depth 1: 1, 2; depth 2: 3; depth 3: 4, 5, 6
    draft = Draft(tree=tree, node_tokens=torch.tensor([10, 11, 12, 13, 14, 15, 16]))
    chain = exact_chain(draft)
    assert chain.tree.spec == TreeSpec.chain(3)
    assert chain.node_tokens.tolist() == [10, 11, 13, 14]
    assert chain.tree.parent == (-1, 0, 1, 2)


def test_a_chain_is_left_as_it_is():
    draft = Draft(tree=tree_tensors(TreeSpec.chain(2)), node_tokens=torch.tensor([1, 2, 3]))
    assert exact_chain(draft) is draft


def test_a_tree_with_a_side_channel_cannot_be_cut_behind_the_methods_back():
    draft = Draft(tree=tree_tensors(TreeSpec((2,))), node_tokens=torch.tensor([1, 2, 3]),
                  carries=SideChannel())
    with pytest.raises(SpeccError, match="chain_only"):
        exact_chain(draft)
