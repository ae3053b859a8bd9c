"""Block tables and slot mapping, with the slot at an exact block boundary and a max_model_len that is not a
multiple of the block size (run through the scheduler)."""

from __future__ import annotations

import pytest
import torch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_table import BlockTable, blocks_needed, slot_mapping
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged_course.engine_views import slot, slots
from paged_course.reference import pad_block_tables


def test_case5_slot_at_an_exact_block_boundary():
    table = BlockTable(4, [10, 11, 12])
    expected = {1: 40, 2: 41, 3: 42, 4: 43, 5: 44, 6: 45, 7: 46, 8: 47, 9: 48}
    for length, want in expected.items():
        assert slot(table, length - 1) == want, f"last slot of a {length}-token sequence"
        assert slot(table, length - 1) == table[(length - 1) // 4] * 4 + (length - 1) % 4
    assert slot(table, 7) == 47, "L = 8 ends block 11 at 47, not 43"
    assert slots(table, 0, 9) == [40, 41, 42, 43, 44, 45, 46, 47, 48]


def test_slot_mapping_of_a_packed_batch():
    # a prefill chunk of 3 tokens from position 2, then a decode at position 8 (an exact block boundary)
    assert slot_mapping([[10, 11], [5, 6, 7]], [2, 8], [3, 1], 4) == [42, 43, 44, 28]
    assert slot_mapping([], [], [], 4) == []


def test_case6_max_model_len_not_a_multiple_of_block_size():
    assert blocks_needed(10, 4) == 3, (
        "a block table for max_model_len 10 has ceil(10 / 4) = 3 entries"
    )
    sched = Scheduler(
        SchedulerConfig(max_model_len=10, max_num_seqs=4, max_num_batched_tokens=16),
        CacheConfig(block_size=4, num_gpu_blocks=8, watermark=0.0),
    )
    fits = SequenceGroup("fits", [Sequence(0, list(range(1, 10)), 4)], SamplingParams(max_tokens=1))
    too_long = SequenceGroup(
        "long", [Sequence(1, list(range(1, 12)), 4)], SamplingParams(max_tokens=1)
    )
    sched.add_request(fits)
    sched.add_request(too_long)
    out = sched.schedule()
    assert [s.group for s in out.ignored] == [too_long], "the 11-token request is rejected up front"
    assert "prompt of 11 tokens is longer than max_model_len=10" in too_long.seqs[0].finish_message
    assert [(s.seq.group, s.num_tokens, len(s.block_table)) for s in out.scheduled] == [
        (fits, 9, 3)
    ]
    fits.seqs[0].append_token_id(7)  # 9 prompt + 1 new token = max_model_len: it ran to the end
    fits.seqs[0].status = SequenceStatus.FINISHED_LENGTH
    sched.free_finished()
    assert fits.is_finished and not sched.has_unfinished_requests()


@pytest.mark.parametrize(
    "n,bs,expected", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (16, 16, 1), (17, 16, 2)]
)
def test_blocks_needed_is_a_ceiling(n, bs, expected):
    assert blocks_needed(n, bs) == expected


def test_bad_input():
    with pytest.raises(ValueError, match="do not fit"):
        BlockTable(4, [1, 2], num_tokens=4)
    table = BlockTable(4, [3], num_tokens=2)
    with pytest.raises(ValueError, match="position 4 is outside"):
        slot(table, 4)
    with pytest.raises(ValueError, match="outside capacity 4"):
        slots(table, 2, 5)


def test_pad_block_tables_makes_an_int32_tensor_padded_with_zero():
    t = pad_block_tables([[5, 2], [7], []], max_blocks=3)
    assert t.dtype == torch.int32 and t.shape == (3, 3)
    assert t.tolist() == [[5, 2, 0], [7, 0, 0], [0, 0, 0]]
    assert pad_block_tables([[1], [2, 3]], pad=-1).tolist() == [[1, -1], [2, 3]]
    with pytest.raises(ValueError, match="more than max_blocks=1"):
        pad_block_tables([[1, 2]], max_blocks=1)
