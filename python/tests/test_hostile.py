"""Hostile sizes from Python: a module inside itself, a thread count far beyond any machine, a
narrow length near 2**63 and adaptive pooling to a huge output are refused with lockstep.Error
or recorded in a bounded number of ops (tests/unit/hostile_sizes_test.cpp has the rest)."""
import pytest

import lockstep
import lockstep.nn as nn


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)


def test_a_module_cannot_contain_itself():
    m = Holder()
    with pytest.raises(lockstep.Error, match="'me' as a child of itself"):
        m.me = m
    child = Holder()
    m.child = child
    with pytest.raises(lockstep.Error, match="'up.child'"):
        child.up = m
    # Nothing was registered: traversals end and see each module once.
    assert len(list(m.parameters())) == 4
    assert len(m.state_dict()) == 4


def test_a_thread_count_far_beyond_any_machine_is_refused():
    before = lockstep.get_num_threads()
    with pytest.raises(lockstep.Error, match="limit of 1024"):
        lockstep.set_num_threads(100000)
    assert lockstep.get_num_threads() == before


def test_narrow_with_a_huge_length_is_an_error_not_an_overflow():
    x = lockstep.zeros(4, 3)
    with pytest.raises(lockstep.Error, match="do not fit"):
        lockstep.narrow(x, 0, 2, 2**63 - 1)


def test_adaptive_avg_pool_to_a_huge_output_records_at_once():
    x = lockstep.rand(1, 1, 5, 7)
    y = nn.AdaptiveAvgPool2d(100000)(x)
    assert tuple(y.shape) == (1, 1, 100000, 100000)
