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
    from sensprof.runtime.kernels import cpu_kernels

    assert select("reference") is reference
    assert select("auto", "cpu") is (cpu_kernels if cpu_kernels.available() is None else reference)
    with pytest.raises(SensprofError):
        select("fastest")
    with pytest.raises(SensprofError, match="read CPU tensors"):
        select("cpu", "cuda:0")


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
@pytest.mark.parametrize("bits_k,bits_v,n_splits,hq", [(4, 2, 1, 4), (3, 4, 2, 6), (2, 8, 3, 2)])
def test_triton_decode_attention_matches_the_reference(bits_k, bits_v, n_splits, hq):
    """hq 6 over 2 KV heads: 3 query heads share a KV head (padded to 4 lanes in the kernel)."""
    out = _run_interpreted(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_kernels import _packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = _packed_cache(bits_k={bits_k}, bits_v={bits_v}, hq={hq})
        a = triton_kernels.decode_attention(**args, **kw, n_splits={n_splits})
        b = reference.decode_attention(**args, **kw)
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        print("ok", err)
    """)
    assert out.startswith("ok")


def test_reference_quantize_pack_matches_the_profilers_quantization():
    """The append kernels store the codes, fp16 scales and zero-points quant.py computes (and the profile measured)."""
    from sensprof.quant import group_last, quantize_groups
    from sensprof.schemes import get_scheme

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 64, 64, generator=g) * 2  # [N, T, D]
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


@needs_triton
def test_triton_quantize_pack_on_append_is_bit_exact():
    out = _run_interpreted("""
        import torch
        from sensprof.runtime.kernels import reference, triton_kernels
        g = torch.Generator().manual_seed(0)
        for bits in (2, 3, 4, 5, 8):
            x = torch.randn(37, 64, generator=g) * 3
            for a, b in zip(triton_kernels.quantize_pack_tokens(x, bits, 32), reference.quantize_pack_tokens(x, bits, 32)):
                assert torch.equal(a, b), ("tokens", bits)
            x = torch.randn(5, 64, 32, generator=g)
            for a, b in zip(triton_kernels.quantize_pack_channels(x, bits, 32),
                            reference.quantize_pack_channels(x, bits, 32)):
                assert torch.equal(a, b), ("channels", bits)
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
def test_triton_decode_attention_reads_token_slices_of_the_cache_in_place():
    """The runtime passes views (the positions both K and V hold packed); strides, not copies."""
    out = _run_interpreted(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_kernels import _packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = _packed_cache(t=96)
        a0, a1 = 32, 96
        args.update(k_codes=args["k_codes"][:, :, :, a0:a1], k_scale=args["k_scale"][:, :, 1:3],
                    k_zero=args["k_zero"][:, :, 1:3], v_codes=args["v_codes"][:, :, :, a0:a1],
                    v_scale=args["v_scale"][:, :, a0:a1], v_zero=args["v_zero"][:, :, a0:a1])
        assert not args["k_codes"].is_contiguous()
        a = triton_kernels.decode_attention(**args, **kw, n_splits=2)
        b = reference.decode_attention(**args, **kw)
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        print("ok", err)
    """)
    assert out.startswith("ok")


@needs_triton
def test_planned_cache_decodes_through_the_triton_kernels_as_through_the_reference():
    """End to end in the interpreter: quantize-and-pack on append and packed decode attention, both Triton."""
    out = _run_interpreted(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from conftest import make_tiny_model
        from test_runtime import _decode, _plan
        from sensprof.runtime import PlannedCache
        from sensprof.runtime.kernels import triton_kernels
        model = make_tiny_model("llama")
        plan = _plan(model, [("int4_c32", "int4_t32"), ("int2_c32_r8", "int3_t32_s2"), ("none", "int8_t32")], [{{}}] * 3)
        ids = torch.randint(3, 300, (2, 72), generator=torch.Generator().manual_seed(5))
        ref = _decode(model, PlannedCache.from_plan(plan, model, kernels="reference"), ids)
        cache = PlannedCache.from_plan(plan, model, kernels="triton")
        got = _decode(model, cache, ids)
        assert cache.layers[0].kernels is triton_kernels and cache.layers[0].k_store.kernels is triton_kernels
        assert cache.layers[0].packed_steps > 0 and cache.layers[1].packed_steps > 0
        err = (got - ref).abs().max().item()
        assert err < 1e-4, err
        print("ok", err)
    """)
    assert out.startswith("ok")


def test_triton_absent_on_a_gpu_falls_back_to_the_reference_with_one_warning(monkeypatch):
    import warnings

    from sensprof.runtime import kernels

    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    monkeypatch.setattr(kernels, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels.select("auto", "cuda") is reference
        assert kernels.select("triton", "cuda:0") is reference
        assert kernels.select("auto", "cuda") is reference
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "triton is not installed" in msgs[0] and "sensprof[kernels]" in msgs[0]
    with pytest.raises(SensprofError, match="need triton installed"):
        kernels.select("triton", "cpu")  # asked for on the CPU without the interpreter: an error, not a fallback
