"""TensorStore: streaming storage of one layer's K or V holds what the profiler's fake quantization computes."""

import types

import pytest
import torch

from sensprof.memory import layer_cache_bytes, quantized_token_count
from sensprof.quant import fake_quant
from sensprof.runtime.store import TensorStore
from sensprof.schemes import get_scheme


@pytest.mark.parametrize("name", ["int4_c32", "int3_t32", "q4_0", "q5_1", "int2_c64_r16_s4", "int8_per_token_head",
                                  "fp8_e4m3", "fp8_per_token_head", "int6_t128_r8", "int4_per_token_head",
                                  "octave_k3v4.K", "octave_k3v4.V", "octave_k3v3.V", "octave_k3v3_compact.K"])
def test_store_holds_what_fake_quant_computes(name, device):
    """Appended in uneven chunks, the store's quantized tokens equal fake quantization of the whole."""
    s = get_scheme(name)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 150, 64, generator=g) * 3).to(device)
    store = TensorStore(s)
    for a, b in ((0, 1), (1, 40), (40, 41), (41, 100), (100, 150)):
        store.append(x[..., a:b, :])
    dense = store.dense()
    assert dense.shape == x.shape
    q = quantized_token_count(s, 150)
    lo = min(s.sink, 150)
    ref = fake_quant(x, s)
    assert torch.equal(dense[..., lo:lo + q, :], ref[..., lo:lo + q, :])
    assert torch.equal(dense[..., :lo, :], x[..., :lo, :])
    assert torch.equal(dense[..., lo + q:, :], x[..., lo + q:, :])


def _reference(x: torch.Tensor, s):
    """held(n): what a store fed x[..., :n, :] holds, from quantizing the whole sequence at once: sinks and
    tokens not yet due as given, the rest as fake quantization computes it."""
    fq = fake_quant(x, s)

    def held(n: int) -> torch.Tensor:
        lo, q = min(s.sink, n), quantized_token_count(s, n)
        return torch.cat([x[..., :lo, :], fq[..., lo:lo + q, :], x[..., lo + q:n, :]], dim=-2)

    return held


def _expected(x: torch.Tensor, s) -> torch.Tensor:
    return _reference(x, s)(x.shape[-2])


def _feed(store: TensorStore, x: torch.Tensor, sizes) -> TensorStore:
    at = 0
    for n in sizes:
        store.append(x[..., at:at + n, :])
        at += n
    assert at == x.shape[-2]
    return store


def _packed(store: TensorStore):
    first, n, q = store.packed_read()
    return first, n, q.codes, q.scale, q.zero


STREAMED = ["int4_c32", "int4_t32", "int2_c64_r16_s4", "int6_t128_r8", "q4_0", "fp8_e4m3", "int8_per_token_head"]


@pytest.mark.parametrize("name", STREAMED)
def test_single_tokens_chunks_and_one_append_read_bit_identically(name, device):
    """Whatever the append sizes, the dense read is the whole-sequence reference and the packed body the
    kernels read is the same tensors."""
    s = get_scheme(name)
    x = (torch.randn(1, 3, 300, 64, generator=torch.Generator().manual_seed(1)) * 2).to(device)
    stores = [_feed(TensorStore(s), x, sizes) for sizes in ([1] * 300, [37, 1, 100, 62, 100], [300])]
    ref = _expected(x, s)
    for store in stores:
        assert torch.equal(store.dense(), ref)
        assert torch.equal(store.dense_range(50, 250), ref[..., 50:250, :])
    one = _packed(stores[-1])
    for store in stores[:-1]:
        got = _packed(store)
        assert got[:2] == one[:2]
        for a, b in zip(got[2:], one[2:]):
            assert (a is None and b is None) or torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                                                            b.view(torch.uint8) if b.element_size() == 1 else b)


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "none"])
def test_capacity_grows_geometrically(name):
    """1000 single-token appends reallocate O(log n) times, and 3000 more only a few times more."""
    store = TensorStore(get_scheme(name))
    x = torch.randn(1, 3, 4000, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    _feed(store, x[..., :1000, :], [1] * 1000)
    first = store.reallocations()
    assert first <= 4 * 12  # at most four buffers, each doubling ~log2(1000) times
    _feed(store, x[..., 1000:, :], [1] * 3000)
    assert store.reallocations() - first <= 4 * 3
    assert torch.equal(store.dense(), _expected(x, get_scheme(name)))


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "int2_c64_r16_s4", "none"])
def test_nbytes_counts_what_is_held_and_capacity_what_is_allocated(name):
    """nbytes is the plan's byte count at every length; the allocation stays within twice that plus the
    room of one pending group."""
    s = get_scheme(name)
    x = torch.randn(1, 3, 700, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    store = TensorStore(s)
    slack = 2 * (s.residual + (s.group or 0)) * 3 * 64 * 2  # full-precision room a pending group may keep
    for n, size in enumerate([200] + [1] * 500, start=1):
        store.append(x[..., store.total:store.total + size, :])
        held = store.nbytes()
        assert held == layer_cache_bytes(s, store.total, 3, 64)
        assert held <= store.capacity_nbytes() <= 2 * held + slack



def _storages(obj, seen=None) -> dict:
    """{storage pointer: bytes} of every tensor an object's attributes reach (buffers, lists, dicts, objects)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (types.ModuleType, type)):
        return {}  # a module (the kernels) or a class is shared by every store, not held by one
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        return {st.data_ptr(): st.nbytes()} if st.nbytes() else {}
    items = (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple))
             else vars(obj).values() if hasattr(obj, "__dict__") else ())
    out = {}
    for x in items:
        if not isinstance(x, (str, bytes, int, float, type(None))):
            out.update(_storages(x, seen))
    return out


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "int2_c64_r16_s4", "fp8_e4m3", "none"])
def test_a_store_keeps_no_more_memory_alive_than_it_counts(name):
    """No view into what was appended outlives the append: a store without sinks once kept its whole first append
    (a prefill's keys or values) alive through the empty view that began its sinks, and a constant-scale one the
    first chunk's per-token scales through a view of one, both uncounted by capacity_nbytes."""
    x = torch.randn(1, 3, 2000, 64, generator=torch.Generator().manual_seed(4))
    store = TensorStore(get_scheme(name))
    store.append(x.clone())  # a prefill: its own tensor, which the caller then drops
    for i in range(5):
        store.append(torch.randn(1, 3, 1, 64))
    unit_scale = 4  # fp8 without scales holds its unit scale as one float, which the plan prices at nothing
    assert sum(_storages(store).values()) <= store.capacity_nbytes() + unit_scale

@pytest.mark.parametrize("name", ["int4_c32", "int4_t32", "int2_c64_r16_s4", "int6_t128_r8", "none"])
def test_sliding_windows_stay_correct_over_many_appends(name):
    """A window kept over 2000 appends (after a long first chunk) holds the newest tokens of the
    whole-sequence reference, and its allocation stops growing and gives the first chunk's room back."""
    s = get_scheme(name)
    x = torch.randn(1, 3, 5000, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    held = _reference(x, s)
    store = TensorStore(s, sliding=True)
    keep = 50
    store.append(x[..., :3000, :])
    first = store.capacity_nbytes()
    allocated = []
    for size in [0] + [1, 1, 3, 1, 2, 1, 7, 1] * 250:
        store.append(x[..., store.total:store.total + size, :])
        store.drop_front(keep)
        assert store.seq_length() >= keep
        assert torch.equal(store.dense(), held(store.total)[..., store.dropped:, :])
        allocated.append(store.capacity_nbytes())
    assert max(allocated[-1000:]) == min(allocated[-1000:])  # steady: room reused, not regrown
    assert allocated[-1] < first / 4  # the first chunk's room was given back
    assert store.seq_length() < keep + 2 * ((s.group or 1) + s.residual + 7)
