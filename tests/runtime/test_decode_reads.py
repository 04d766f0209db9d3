"""DecodeReads: the reads and tails a layer keeps between decode steps are, at every step, what building them afresh
gives, and a step that changes nothing but the new token rebuilds nothing."""

import pytest
import torch

from sensprof.runtime.decode_reads import DecodeReads
from sensprof.runtime.kernels.reference import dequantize_read
from sensprof.runtime.store import GrowingBuffer, TensorStore
from sensprof.schemes import get_scheme

PAIRS = [("int3_c32_r32_s4", "int5_t64"),  # keys pending a group and a residual, values packed at once, sinks on K only
         ("int4_c128", "int4_t32"),
         ("int4_per_token_head", "int4_per_token_head"),  # every token packed on both sides: no tail
         ("int4_c32", "int4_t32_r16"),  # a value residual: tokens of the tail pack as the steps go
         ("int4_c32_r16", "none"),  # an unquantized side read as held
         ("fp8_e4m3", "q4_0")]


def _stores(k_name, v_name, sliding=False):
    return TensorStore(get_scheme(k_name), sliding=sliding), TensorStore(get_scheme(v_name), sliding=sliding)


def _same(kept, fresh):
    a, b, *reads = kept
    a_, b_, *reads_ = fresh
    assert (a, b) == (a_, b_)
    for x, y in zip(reads[:2], reads_[:2]):
        assert x.tokens == y.tokens and torch.equal(dequantize_read(x), dequantize_read(y))
    for x, y in zip(reads[2:], reads_[2:]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("k_name, v_name", PAIRS)
def test_kept_reads_equal_fresh_ones_at_every_step(k_name, v_name):
    """A prompt, then 300 single-token steps: past group boundaries, residuals draining, buffers doubling."""
    x = torch.randn(2, 3, 400, 64, generator=torch.Generator().manual_seed(0)) * 2
    ks, vs = _stores(k_name, v_name)
    kept = DecodeReads()
    ks.append(x[..., :90, :])
    vs.append(x[..., :90, :])
    for t in range(90, 390):
        ks.append(x[..., t:t + 1, :])
        vs.append(x[..., t:t + 1, :])
        _same(kept.step(ks, vs, 0, t + 1), DecodeReads().step(ks, vs, 0, t + 1))


def test_kept_reads_follow_a_sliding_window():
    x = torch.randn(1, 2, 600, 64, generator=torch.Generator().manual_seed(1))
    ks, vs = _stores("int4_c32", "int4_t32", sliding=True)
    kept = DecodeReads()
    window = 100
    for t in range(600):
        ks.append(x[..., t:t + 1, :])
        vs.append(x[..., t:t + 1, :])
        ks.drop_front(window)
        vs.drop_front(window)
        lo = max(ks.dropped, vs.dropped)
        _same(kept.step(ks, vs, lo, t + 1), DecodeReads().step(ks, vs, lo, t + 1))


def test_a_step_that_only_appends_rebuilds_nothing(monkeypatch):
    """Between key groups the packed reads are the same objects (the kernels' descriptions of them are reused) and
    the tails gain one row: no read is narrowed, and no tail is assembled again."""
    import sensprof.runtime.decode_reads as dr

    x = torch.randn(1, 3, 200, 64, generator=torch.Generator().manual_seed(2))
    ks, vs = _stores("int4_c32", "int4_t32")
    kept = DecodeReads()
    for lo, hi in ((0, 65), (65, 66)):  # a prompt, then one step (the value buffers double, moving codes once)
        ks.append(x[..., lo:hi, :])
        vs.append(x[..., lo:hi, :])
        first = kept.step(ks, vs, 0, hi)
    built = []
    for name in ("packed_reads", "tail"):
        monkeypatch.setattr(dr, name, lambda *a, f=getattr(dr, name), n=name: built.append(n) or f(*a))
    for t in range(66, 95):  # within the key group [64, 96)
        ks.append(x[..., t:t + 1, :])
        vs.append(x[..., t:t + 1, :])
        step = kept.step(ks, vs, 0, t + 1)
        assert step[2] is first[2] and step[3] is first[3]
        assert step[4].shape[-2] == step[5].shape[-2] == t + 1 - 64
    assert built == []
    ks.append(x[..., 95:96, :])  # the group packs: K's read grows, the tail empties
    vs.append(x[..., 95:96, :])
    step = kept.step(ks, vs, 0, 96)
    assert step[:2] == (0, 96) and step[4].shape[-2] == 0 and built[0] == "packed_reads"


def test_a_move_of_the_buffers_rebuilds_the_reads():
    """A compaction moves held items under views taken before it (a reallocation leaves those on the old copy): the
    buffers count both, and a count that changed rebuilds the reads."""
    buf = GrowingBuffer(0)
    buf.append(torch.arange(16.0))
    moves, allocations = buf.moves, buf.reallocations
    buf.drop_front(10)
    buf.append(torch.arange(2.0))  # no room at the end, room enough at the front: the live items move there
    assert buf.moves == moves + 1 and buf.reallocations == allocations and buf.start == 0
    assert torch.equal(buf.view(), torch.tensor([10.0, 11, 12, 13, 14, 15, 0, 1]))

    x = torch.randn(1, 3, 200, 64, generator=torch.Generator().manual_seed(3))
    ks, vs = _stores("int4_c32", "int4_t32")
    ks.append(x[..., :70, :])
    vs.append(x[..., :70, :])
    kept = DecodeReads()
    before = kept.step(ks, vs, 0, 70)
    assert kept.step(ks, vs, 0, 70)[3] is before[3]
    vs._codes.moves += 1
    assert kept.step(ks, vs, 0, 70)[3] is not before[3]
