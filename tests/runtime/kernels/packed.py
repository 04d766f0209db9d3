"""Packed caches as the decode kernels read them (PackedRead), from random K and V."""

import torch

from sensprof.runtime.kernels import reference
from sensprof.runtime.kernels.contract import PackedRead



def _table(bits, device):
    return torch.arange(2 ** bits, dtype=torch.float32, device=device)


def kivi_keys(codes, scale, zero, bits, group):
    return PackedRead(codes=codes, scale=scale, zero=zero, lut=_table(bits, codes.device), bits=bits,
                      token_group=group, channel_group=1, offset=0.0)


def kivi_values(codes, scale, zero, bits, group):
    return PackedRead(codes=codes, scale=scale, zero=zero, lut=_table(bits, codes.device), bits=bits,
                      token_group=1, channel_group=group, offset=0.0)


def packed_cache(b=2, hq=4, hkv=2, t=64, tail=5, d=32, bits_k=4, bits_v=2, gk=32, gv=16, seed=0, device="cpu"):
    """(decode_attention's tensor arguments, its keyword arguments, (K, V) before quantization): KIVI keys (per
    channel over gk tokens) and values (per token over gv channels)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, hkv, t, d, generator=g) * 2
    v = torch.randn(b, hkv, t, d, generator=g)
    kc, ks, kz = reference.quantize_pack_channels(k.reshape(b * hkv, t, d), bits_k, gk)
    vc, vs, vz = reference.quantize_pack_tokens(v.reshape(-1, d), bits_v, gv)
    q = torch.randn(b, hq, d, generator=g)
    k_tail, v_tail = torch.randn(b, hkv, tail, d, generator=g), torch.randn(b, hkv, tail, d, generator=g)
    kc, ks, kz, vc, vs, vz, q, k_tail, v_tail = (x.to(device) for x in (kc, ks, kz, vc, vs, vz, q, k_tail, v_tail))
    args = dict(q=q, k=kivi_keys(kc.view(bits_k, b, hkv, t, d // 8), ks.view(b, hkv, t // gk, d),
                                 kz.view(b, hkv, t // gk, d), bits_k, gk),
                v=kivi_values(vc.view(bits_v, b, hkv, t, d // 8), vs.view(b, hkv, t, d // gv),
                              vz.view(b, hkv, t, d // gv), bits_v, gv),
                k_tail=k_tail, v_tail=v_tail)
    return args, dict(scaling=d ** -0.5), (k.to(device), v.to(device))
