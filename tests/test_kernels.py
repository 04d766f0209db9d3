"""Triton kernels against their PyTorch references, under TRITON_INTERPRET=1 on the CPU.

Two tiers: packing bit-exact; packed decode attention within a tight tolerance. Skipped cleanly when
triton is absent. Each Triton test runs in a subprocess, because the interpreter switch must be set
before triton is imported.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sensprof.errors import SensprofError
from sensprof.runtime.kernels import reference, select, triton_available

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")


def _run_interpreted(code: str):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _packed_cache(b=2, hq=4, hkv=2, t=64, tail=5, d=32, bits_k=4, bits_v=2, gk=32, gv=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, hkv, t, d, generator=g) * 2
    v = torch.randn(b, hkv, t, d, generator=g)
    # keys per channel over groups of gk tokens: quantize the transposed groups as "tokens"
    kt = k.reshape(b, hkv, t // gk, gk, d).transpose(-1, -2).reshape(-1, gk)
    kc, ks, kz = reference.quantize_pack_tokens(kt, bits_k, gk)
    codes_k = reference.unpack_bitplanes(kc, bits_k).reshape(b, hkv, t // gk, d, gk).transpose(-1, -2)
    k_codes = reference.pack_bitplanes(codes_k.reshape(b, hkv, t, d), bits_k)
    k_scale, k_zero = ks.reshape(b, hkv, t // gk, d), kz.reshape(b, hkv, t // gk, d)
    vc, vs, vz = reference.quantize_pack_tokens(v.reshape(-1, d), bits_v, gv)
    v_codes = vc.reshape(bits_v, b, hkv, t, d // 8)
    v_scale, v_zero = vs.reshape(b, hkv, t, d // gv), vz.reshape(b, hkv, t, d // gv)
    q = torch.randn(b, hq, d, generator=g)
    k_tail, v_tail = torch.randn(b, hkv, tail, d, generator=g), torch.randn(b, hkv, tail, d, generator=g)
    return dict(q=q, k_codes=k_codes, k_scale=k_scale, k_zero=k_zero, v_codes=v_codes, v_scale=v_scale,
                v_zero=v_zero, k_tail=k_tail, v_tail=v_tail), dict(bits_k=bits_k, bits_v=bits_v, group_k=gk,
                                                                    group_v=gv, scaling=d ** -0.5), (k, v)


def test_reference_decode_attention_equals_dense_attention_over_the_dequantized_cache():
    args, kw, (k, v) = _packed_cache()
    out = reference.decode_attention(**args, **kw)
    # dequantization error of 4-bit keys / 2-bit values is real but bounded: compare to the exact cache
    kk = torch.cat([k, args["k_tail"]], 2).repeat_interleave(2, 1)
    vv = torch.cat([v, args["v_tail"]], 2).repeat_interleave(2, 1)
    exact = torch.einsum("bht,bhtd->bhd", torch.softmax(torch.einsum("bhd,bhtd->bht", args["q"], kk) * kw["scaling"],
                                                        -1), vv)
    assert out.shape == exact.shape
    assert 1e-3 < (out - exact).abs().max() < 0.5


def test_kernel_selection():
    assert select("reference") is reference
    assert select("auto", "cpu") is reference
    with pytest.raises(SensprofError):
        select("fastest")


@needs_triton
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_triton_pack_is_bit_exact(bits):
    out = _run_interpreted(f"""
        import torch
        from sensprof.runtime.kernels import reference, triton_kernels
        codes = torch.randint(0, 2**{bits}, (3, 5, 64), generator=torch.Generator().manual_seed({bits}),
                              dtype=torch.uint8)
        a = triton_kernels.pack_bitplanes(codes, {bits})
        b = reference.pack_bitplanes(codes, {bits})
        assert torch.equal(a, b), (a - b).abs().max()
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
@pytest.mark.parametrize("bits_k,bits_v,n_splits", [(4, 2, 1), (3, 4, 2), (2, 8, 3)])
def test_triton_decode_attention_matches_the_reference(bits_k, bits_v, n_splits):
    out = _run_interpreted(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_kernels import _packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = _packed_cache(bits_k={bits_k}, bits_v={bits_v})
        a = triton_kernels.decode_attention(**args, **kw, n_splits={n_splits})
        b = reference.decode_attention(**args, **kw)
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        print("ok", err)
    """)
    assert out.startswith("ok")
