"""Call segments by hand on small padded and packed batches: ids, rows and ordinals, recorded call
starts (out-of-range ones ignored), per-call info and sampling settings, broadcasting and sums."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from synthetic import row

from polar_pl.datamodule.collate import collate
from polar_pl.module.segments import Segments, call_info, call_segments, per_token, sampling_of, segment_sum

T = torch.tensor


def segments_of(b) -> Segments:
    return call_segments(b.loss_mask, b.row_index, b.position_ids, b.row_meta)


def test_padded_rows_segments_by_hand() -> None:
    """Row 0: calls at [1, 3) and [3, 5) (touching, split by the recorded start 3) and [6, 7);
    row 1: one call [2, 4) recorded at start 2, plus padding."""
    rows = [row("a", "g", 1.0, [(1, 3), (3, 5), (6, 7)], 7), row("b", "g", 0.0, [(2, 4)], 5)]
    s = segments_of(collate(rows, mode="pad"))
    assert s.index.tolist() == [[-1, 0, 0, 1, 1, -1, 2], [-1, -1, 3, 3, -1, -1, -1]]
    assert s.row.tolist() == [0, 0, 0, 1] and s.ordinal.tolist() == [0, 1, 2, 0] and s.count == 4


def test_packed_rows_keep_apart_and_count_ordinals_per_row() -> None:
    """Two rows in one sequence, the second's call starting right where the first's ends: the
    row boundary splits them even without recorded starts."""
    a = replace(row("a", "g", 1.0, [(1, 4)], 4), meta={})
    b = replace(row("b", "g", 0.0, [(0, 2), (3, 4)], 4), meta={})
    batch = collate([a, b], token_budget=8)
    s = segments_of(batch)
    order = batch.row_index[0].tolist()
    assert order == [0, 0, 0, 0, 1, 1, 1, 1]
    assert s.index.tolist() == [[-1, 0, 0, 0, 1, 1, -1, 2]]
    assert s.row.tolist() == [0, 1, 1] and s.ordinal.tolist() == [0, 0, 1]


def test_recorded_starts_out_of_range_or_absent() -> None:
    """A start past every position is ignored; a row without meta or calls adds no start."""
    r = row("a", "g", 1.0, [(1, 3), (3, 5)], 6)
    r.meta["calls"] += [
        {"start": p, "finish_reason": None, "sampling": {}} for p in (6, 50)
    ]  # positions 0..5
    plain = replace(row("b", "g", 0.0, [(1, 3), (3, 5)], 6), meta={"calls": None})
    s = segments_of(collate([r, plain], mode="pad"))
    assert s.index.tolist() == [[-1, 0, 0, 1, 1, -1], [-1, 2, 2, 2, 2, -1]]
    assert s.ordinal.tolist() == [0, 1, 0]
    bare = segments_of(collate([replace(r, meta={})], mode="pad"))
    assert bare.count == 1


def test_call_info_per_segment() -> None:
    r = row("a", "g", 1.0, [(1, 3), (4, 5)], 6, finish=["stop", "length"], sampling=[{"top_k": 3}, {}])
    b = collate([r, replace(row("b", "g", 0.0, [(1, 2)], 3), meta={})], mode="pad")
    s = segments_of(b)
    info = call_info(s, b.row_meta)
    assert info == [
        {"start": 1, "finish_reason": "stop", "sampling": {"top_k": 3}},
        {"start": 4, "finish_reason": "length", "sampling": {}},
        {},
    ]
    # a row that records fewer calls than it has runs, and a segment row past row_meta: {}
    two = Segments(T([[0, 1]]), T([0, 0]), T([0, 1]))
    assert call_info(two, [{"meta": {"calls": [{"start": 0}]}}]) == [{"start": 0}, {}]
    assert call_info(Segments(T([[0]]), T([3]), T([0])), [{}]) == [{}]
    assert call_info(Segments(T([[0]]), T([1]), T([0])), [{}]) == [{}]  # just past the end


def test_per_token_and_segment_sum() -> None:
    s = Segments(T([[-1, 0, 0, 1], [1, -1, 2, 2]]), T([0, 0, 1]), T([0, 1, 0]))
    full = per_token(s, T([1.5, -2.0, 4.0], dtype=torch.float64), 7.0)
    assert full.dtype == torch.float64 and full.tolist() == [[7.0, 1.5, 1.5, -2.0], [-2.0, 7.0, 4.0, 4.0]]
    assert per_token(s, T([True, False, True]), False).tolist() == [
        [False, True, True, False],
        [False, False, True, True],
    ]
    x = T([[9.0, 1.0, 2.0, 3.0], [4.0, 9.0, 5.0, 0.25]])
    sums = segment_sum(x, s)
    assert sums.dtype == torch.float64 and sums.tolist() == [3.0, 7.0, 5.25]


def test_sampling_of_fills_unrecorded_settings() -> None:
    s = Segments(T([[-1, 0, 0, 1, 2]]), T([0, 0, 0]), T([0, 1, 2]))
    info = [{"sampling": {"temperature": 0.5, "top_p": None, "top_k": 4}}, {}, {"sampling": {"top_p": 0.3}}]
    samp = sampling_of(s, info, default_temperature=0.8)
    assert samp.temperature.tolist()[0] == pytest.approx([0.8, 0.5, 0.5, 0.8, 0.8])
    assert samp.top_k.tolist()[0] == [-1, 4, 4, -1, -1] and samp.top_k.dtype == torch.long
    assert samp.top_p.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.3])
    assert samp.temperature.dtype == samp.top_p.dtype == torch.float32
    assert sampling_of(s, info).temperature.tolist()[0] == pytest.approx([1.0, 0.5, 0.5, 1.0, 1.0])
    empty = sampling_of(Segments(T([[-1, -1]]), T([], dtype=torch.long), T([], dtype=torch.long)), [])
    assert empty.top_k.dtype == torch.long and empty.top_k.tolist() == [[-1, -1]]  # no call at all


def test_select_keeps_global_segment_ids() -> None:
    s = Segments(T([[0, -1], [1, 2]]), T([0, 1, 1]), T([0, 0, 1]))
    sub = s.select(T([1]))
    assert sub.index.tolist() == [[1, 2]] and sub.row is s.row and sub.ordinal is s.ordinal and sub.count == 3
