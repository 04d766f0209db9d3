"""The Hadamard rotations llama.cpp applies around a quantized cache (rotation.py; checked against the engine's
stored bytes in tests/engines/test_llamacpp_cache.py)."""

from __future__ import annotations

import pytest
import torch

from sensprof.quant import fake_quant, quantize_query
from sensprof.rotation import block_size, hadamard, interleave_order, rotate, unrotate
from sensprof.schemes import get_scheme


@pytest.mark.parametrize("n", [64, 128, 256])
def test_hadamard_is_orthogonal_symmetric_and_plus_minus(n):
    h = hadamard(n)
    assert torch.allclose(h @ h, torch.eye(n), atol=1e-5)
    assert torch.equal(h, h.T)
    assert torch.equal(h.abs(), torch.full((n, n), 1 / n**0.5))


def test_block_sizes_follow_llamacpp():
    """Keys: the largest power of two >= 64 dividing head_dim; values: 64; no rotation where 64 does not divide."""
    assert [block_size("hadamard_keys", d) for d in (64, 128, 192, 256, 96, 32)] == [64, 128, 64, 256, 0, 0]
    assert [block_size("hadamard64", d) for d in (64, 256, 96)] == [64, 64, 0]
    assert block_size("", 64) == 0


def test_interleave_order_pairs_rotary_halves():
    assert interleave_order(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("order", ["halves", "interleaved"])
@pytest.mark.parametrize("d", [64, 128, 256, 96])
def test_rotation_round_trips_and_keeps_products(order, d):
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, 3, 5, d, generator=g), torch.randn(2, 3, 7, d, generator=g)
    rq, rk = rotate(q, "hadamard_keys", order), rotate(k, "hadamard_keys", order)
    assert torch.allclose(unrotate(rq, "hadamard_keys", order), q, atol=1e-5)
    assert torch.allclose(rq @ rk.transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-4)
    if d % 64 == 0:
        assert not torch.allclose(rk, k, atol=1e-3)
    else:
        assert torch.equal(rk, k)


def test_rotation_spreads_an_outlier_channel():
    """Why llama.cpp rotates: one large channel sets a q4_0 block's scale and crushes the rest; rotated, it does
    not, so the rotated keys' error is several times smaller."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 64, 64, generator=g)
    k[..., 5] *= 30
    plain = (fake_quant(k, get_scheme("q4_0")) - k).pow(2).mean()
    rotated = (fake_quant(k, get_scheme("llamacpp_q4_0.K")) - k).pow(2).mean()
    assert rotated < plain / 3


def test_query_is_quantized_in_the_rotated_basis():
    """The attention scores of a rotated key scheme are the rotated q8 query against the rotated stored key."""
    from sensprof.engines.llamacpp.query import quantize_query_q8

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 3, 4, 64, generator=g), torch.randn(1, 3, 6, 64, generator=g)
    for order in ("halves", "interleaved"):
        s = get_scheme(f"llamacpp_q8_0.K{'_interleaved' if order == 'interleaved' else ''}")
        scores = quantize_query(s, q) @ fake_quant(k, s).transpose(-1, -2)
        plain = get_scheme("q8_0")
        want = quantize_query_q8(rotate(q, s.rotation, order)) @ fake_quant(rotate(k, s.rotation, order),
                                                                            plain).transpose(-1, -2)
        assert torch.allclose(scores, want, atol=1e-4)
        assert not torch.allclose(quantize_query(s, q), q, atol=1e-4)  # the query is quantized, not passed through


def test_the_runtime_refuses_rotated_schemes_and_the_free_target_skips_them():
    """llama.cpp's rotated cache is emulated for profiling and validation; sensprof's runtime stores plain codecs."""
    from sensprof.planning.planner import runtime_format
    from sensprof.runtime.store import runtime_problem

    for name in ("llamacpp_q4_0.K", "llamacpp_q4_0.K_interleaved", "llamacpp_q8_0.V"):
        assert "llama.cpp's rotated cache" in runtime_problem(get_scheme(name), 64)
        assert not runtime_format(name)
    assert runtime_problem(get_scheme("q4_0"), 64) is None and runtime_format("q4_0")


def test_rotated_schemes_take_no_modifiers():
    from sensprof.errors import SensprofError

    with pytest.raises(SensprofError, match="engine's own format and takes no modifiers"):
        get_scheme("llamacpp_q4_0.V_r32")
