"""proposers/rows.py: the row window and queue the MTP and EAGLE-3 heads keep (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from llama_dflash.errors import LlamaCallError
from llama_dflash.proposers.rows import RowQueue, RowWindow


def _rows(pos0: int, n: int) -> np.ndarray:
    return np.arange(pos0, pos0 + n, dtype=np.float32)[:, None].repeat(3, axis=1)


def test_window_replaces_from_pos0_and_keeps_the_latest():
    w = RowWindow(3, "the row", keep=6)
    w.put(_rows(0, 4), 0)
    w.put(_rows(2, 3) + 100, 2)  # a re-decode from 2: rows 2.. replaced, 0..1 kept
    assert (w.start, w.end) == (0, 5)
    assert w.at(1)[0] == 1 and w.at(2)[0] == 102 and w.at(4)[0] == 104
    w.put(_rows(5, 4), 5)  # adjacent: appended, then only the latest 6 kept
    assert (w.start, w.end) == (3, 9) and w.at(3)[0] == 103 and w.at(8)[0] == 8
    w.put(_rows(20, 2), 20)  # not adjacent: a fresh window
    assert (w.start, w.end) == (20, 22) and not w.knows(8)
    with pytest.raises(LlamaCallError, match="the row at position 8 is no longer kept"):
        w.at(8)
    assert w.addr(21) == w.rows.ctypes.data + w.rows.strides[0]


def test_window_cut_state_and_clear():
    w = RowWindow(3, "g")
    w.put(_rows(10, 5), 10)
    w.cut(12)
    assert (w.start, w.end) == (10, 12)
    w.cut(3)
    assert w.end == 10 and not w.knows(10)
    w.put(_rows(10, 2), 10)
    saved = w.state()
    w.rows[:] = -1  # the state is a copy
    w.clear()
    assert w.end == 0 and not w.knows(0)
    w.set_state(saved)
    assert (w.start, w.end) == (10, 12) and w.at(11)[0] == 11


def test_queue_cut_keeps_what_lies_before_n_past():
    q = RowQueue()
    assert not q
    q.put(np.array([1, 2, 3], dtype=np.int32), _rows(4, 3), 4)
    q.put(np.array([4, 5], dtype=np.int32), _rows(7, 2), 7)
    q.cut(6)
    items = q.take()
    assert len(items) == 1 and list(items[0][0]) == [1, 2] and items[0][1].shape == (2, 3) and items[0][2] == 4
    assert not q and q.take() == []
