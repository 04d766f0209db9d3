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


# Every codec and granularity the store packs: min-max per channel (3-bit over 128 tokens) and per token (3-8
# bits), llama.cpp's blocks (signed-max q4_0 / q5_0, absmax q8_0, min-max q4_1), per tensor int8, fp8 bytes per
# tensor (plain and calibrated), per head and per token-head, absmax int8 per token-head, 2-bit with sinks and a
# residual, vLLM's rotated int4 per token-head (its fp32 word split by the kernel), and an unquantized side
# ("none", read as held).
LAYOUTS = ["int4_c32", "int3_c128", "int4_t32", "int5_t64", "int8_t32", "q4_0", "q4_1", "q5_0", "q8_0", "int8",
           "fp8_e4m3", "fp8_e4m3_cal", "fp8_e4m3_head", "fp8_per_token_head", "int8_per_token_head",
           "int2_c32_r32_s4", "int4_per_token_head", "none"]


# vLLM's Octave (head dims in multiples of 64 only): block keys with 4-bit rotary and 3-bit other dims (a wide read),
# compact 3-bit keys, 4- and 3-bit codebook values, and Octave keys beside an integer value layout
OCTAVE_PAIRS = [("octave_k3v4.K", "octave_k3v4.V"), ("octave_k3v3_compact.K", "octave_k3v3.V"),
                ("octave_k3v3.K", "int4_t32")]


def store_of(name, x, kernels="reference"):
    """A TensorStore of scheme `name` holding x [B, H, T, D] (appended in two parts), with per-head absmax
    statistics where the scheme is calibrated."""
    from sensprof.runtime.store import TensorStore
    from sensprof.schemes import get_scheme

    scheme = get_scheme(name)
    absmax = x.abs().amax(dim=(0, 2, 3)).float() if scheme.scale_source == "calibrated" else None
    store = TensorStore(scheme, absmax=absmax, kernels=kernels)
    cut = x.shape[2] // 3
    store.append(x[:, :, :cut])
    store.append(x[:, :, cut:])
    return store


def rope_tables(b, t, r, seed=0, device="cpu"):
    """(cos, sin) float32 [B, T, R / 2] of random positions (transformers' inverse frequencies, base 10000)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 4096, (b, t), generator=g).float()
    inv = 1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
    ang = pos[..., None] * inv
    return ang.cos().to(device), ang.sin().to(device)


def store_reads(k_name, v_name, b=2, hq=6, hkv=2, t=300, tail=5, d=64, seed=0, device="cpu"):
    """decode_attention's arguments over the tokens both a `k_name` key store and a `v_name` value store hold packed
    (as the cache reads them: from a whole group of both), with random q and tails."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, hkv, t, d, generator=g) * 2 + torch.randn(1, hkv, 1, d, generator=g)
    v = torch.randn(b, hkv, t, d, generator=g)
    (k0, nk, kr), (v0, nv, vr) = store_of(k_name, k).packed_read(), store_of(v_name, v).packed_read()
    a, end = max(k0, v0), min(k0 + nk, v0 + nv)
    while (a - k0) % kr.token_group or (a - v0) % vr.token_group:
        a += 1
    kr, vr = kr.narrow(a - k0, end - k0), vr.narrow(a - v0, end - v0)
    q = torch.randn(b, hq, d, generator=g)
    k_tail, v_tail = torch.randn(b, hkv, tail, d, generator=g), torch.randn(b, hkv, tail, d, generator=g)
    if device != "cpu":
        kr, vr = (_to(r, device) for r in (kr, vr))
    return dict(q=q.to(device), k=kr, v=vr, k_tail=k_tail.to(device), v_tail=v_tail.to(device)), dict(scaling=d ** -0.5)


def _to(r, device):
    from dataclasses import replace

    move = (lambda x: None if x is None else x.to(device))
    return replace(r, codes=move(r.codes), scale=move(r.scale), zero=move(r.zero), lut=move(r.lut))
