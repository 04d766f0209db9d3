"""A packed KIVI cache (keys per channel, values per token) as the decode kernels read it, from random K and V."""

import torch

from sensprof.runtime.kernels import reference


def packed_cache(b=2, hq=4, hkv=2, t=64, tail=5, d=32, bits_k=4, bits_v=2, gk=32, gv=16, seed=0, device="cpu"):
    """(decode_attention's tensor arguments, its keyword arguments, (K, V) before quantization)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, hkv, t, d, generator=g) * 2
    v = torch.randn(b, hkv, t, d, generator=g)
    kc, ks, kz = reference.quantize_pack_channels(k.reshape(b * hkv, t, d), bits_k, gk)
    vc, vs, vz = reference.quantize_pack_tokens(v.reshape(-1, d), bits_v, gv)
    args = dict(q=torch.randn(b, hq, d, generator=g),
                k_codes=kc.view(bits_k, b, hkv, t, d // 8), k_scale=ks.view(b, hkv, t // gk, d),
                k_zero=kz.view(b, hkv, t // gk, d), v_codes=vc.view(bits_v, b, hkv, t, d // 8),
                v_scale=vs.view(b, hkv, t, d // gv), v_zero=vz.view(b, hkv, t, d // gv),
                k_tail=torch.randn(b, hkv, tail, d, generator=g), v_tail=torch.randn(b, hkv, tail, d, generator=g))
    args = {name: x.to(device) for name, x in args.items()}
    kw = dict(bits_k=bits_k, bits_v=bits_v, group_k=gk, group_v=gv, scaling=d ** -0.5)
    return args, kw, (k.to(device), v.to(device))
