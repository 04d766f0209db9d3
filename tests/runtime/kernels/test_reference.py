"""The PyTorch reference kernels: bit-plane packing, quantize-and-pack as the profiler quantizes, decode attention."""

import pytest
import torch
from runtime.kernels.packed import packed_cache

from sensprof.quant import group_last, quantize_groups
from sensprof.runtime.kernels import reference
from sensprof.schemes import get_scheme


@pytest.mark.parametrize("bits", range(2, 9))
def test_bitplanes_round_trip_exactly_and_cost_b_bits(bits, device):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (2, 3, 5, 64), generator=g, dtype=torch.uint8).to(device)
    packed = reference.pack_bitplanes(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() * 8 == codes.numel() * bits
    assert torch.equal(reference.unpack_bitplanes(packed, bits), codes)


def test_packing_needs_a_multiple_of_eight():
    with pytest.raises(ValueError):
        reference.pack_bitplanes(torch.zeros(1, 12, dtype=torch.uint8), 4)


def test_reference_decode_attention_equals_dense_attention_over_the_dequantized_cache(device):
    args, kw, (k, v) = packed_cache(device=device)
    out = reference.decode_attention(**args, **kw)
    # dequantization error of 4-bit keys / 2-bit values is real but bounded: compare to the exact cache
    kk = torch.cat([k, args["k_tail"]], 2).repeat_interleave(2, 1)
    vv = torch.cat([v, args["v_tail"]], 2).repeat_interleave(2, 1)
    exact = torch.einsum("bht,bhtd->bhd", torch.softmax(torch.einsum("bhd,bhtd->bht", args["q"], kk) * kw["scaling"],
                                                        -1), vv)
    assert out.shape == exact.shape
    assert 1e-3 < (out - exact).abs().max() < 0.5


def test_reference_quantize_pack_matches_the_profilers_quantization(device):
    """The append kernels store the codes, fp16 scales and zero-points quant.py computes (and the profile measured)."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 64, 64, generator=g) * 2).to(device)  # [N, T, D]
    for bits in (2, 3, 4, 8):
        codes, scale, zero = reference.quantize_pack_tokens(x.reshape(-1, 64), bits, 32)
        q = quantize_groups(group_last(x.reshape(-1, 64), 32), get_scheme(f"int{bits}_t32"))
        assert torch.equal(reference.unpack_bitplanes(codes, bits).float(), q.codes.reshape(-1, 64))
        assert torch.equal(scale.float(), q.scale.squeeze(-1)) and torch.equal(zero.float(), q.zero.squeeze(-1))
        codes, scale, zero = reference.quantize_pack_channels(x, bits, 32)
        q = quantize_groups(group_last(x.transpose(-1, -2), 32), get_scheme(f"int{bits}_c32"))  # [N, D, T/G, G]
        want = q.codes.reshape(6, 64, 64).transpose(-1, -2)
        assert torch.equal(reference.unpack_bitplanes(codes, bits).float(), want)
        assert torch.equal(scale.float(), q.scale.squeeze(-1).transpose(-1, -2))
