"""TensorStore: streaming storage of one layer's K or V holds what the profiler's fake quantization computes."""

import pytest
import torch

from sensprof.memory import quantized_token_count
from sensprof.quant import fake_quant
from sensprof.runtime.store import TensorStore
from sensprof.schemes import get_scheme


@pytest.mark.parametrize("name", ["int4_c32", "int3_t32", "q4_0", "q5_1", "int2_c64_r16_s4", "int8_per_token_head",
                                  "fp8_e4m3", "fp8_per_token_head", "int6_t128_r8"])
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
