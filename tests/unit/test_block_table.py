"""Block tables and slot mapping, with the slot at an exact block boundary and a max_model_len that is not a
multiple of the block size."""

from __future__ import annotations

import pytest
import torch

from paged.core.block_table import (
    BlockTable,
    SequenceTooLongError,
    blocks_needed,
    check_length,
    pad_block_tables,
    width,
)


def test_case5_slot_at_an_exact_block_boundary():
    table = BlockTable(4, [10, 11, 12])
    expected = {1: 40, 2: 41, 3: 42, 4: 43, 5: 44, 6: 45, 7: 46, 8: 47, 9: 48}
    for length, slot in expected.items():
        assert table.slot(length - 1) == slot, f"last slot of a {length}-token sequence"
        assert table.slot(length - 1) == table[(length - 1) // 4] * 4 + (length - 1) % 4
    assert table.slot(7) == 47, "L = 8 ends block 11 at 47, not 43"
    assert table.slot_mapping(0, 9) == [40, 41, 42, 43, 44, 45, 46, 47, 48]


def test_case6_max_model_len_not_a_multiple_of_block_size():
    assert width(10, 4) == 3, "block-table width is ceil(10 / 4)"
    check_length(9 + 1, 10)  # a 9-token prompt plus 1 new token fits
    assert blocks_needed(10, 4) <= width(10, 4)
    with pytest.raises(SequenceTooLongError, match="needs 11 tokens but max_model_len is 10"):
        check_length(11, 10)


@pytest.mark.parametrize("n,bs,expected", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (16, 16, 1), (17, 16, 2)])
def test_blocks_needed_is_a_ceiling(n, bs, expected):
    assert blocks_needed(n, bs) == expected


def test_bad_input():
    with pytest.raises(ValueError, match="block_size must be a positive"):
        BlockTable(0)
    with pytest.raises(ValueError, match="block_size must be a positive"):
        blocks_needed(3, -1)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        blocks_needed(-1, 4)
    with pytest.raises(ValueError, match="do not fit"):
        BlockTable(4, [1, 2], num_tokens=4)
    table = BlockTable(4, [3], num_tokens=2)
    with pytest.raises(ValueError, match="position 4 is outside"):
        table.slot(4)
    with pytest.raises(ValueError, match="outside capacity 4"):
        table.slot_mapping(2, 5)


def test_pad_block_tables_makes_an_int32_tensor_padded_with_zero():
    t = pad_block_tables([[5, 2], [7], []], max_blocks=3)
    assert t.dtype == torch.int32 and t.shape == (3, 3)
    assert t.tolist() == [[5, 2, 0], [7, 0, 0], [0, 0, 0]]
    assert pad_block_tables([[1], [2, 3]], pad=-1).tolist() == [[1, -1], [2, 3]]
    with pytest.raises(ValueError, match="more than max_blocks=1"):
        pad_block_tables([[1, 2]], max_blocks=1)
