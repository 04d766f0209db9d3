"""Triton kernels against their PyTorch references, under TRITON_INTERPRET=1 on the CPU.

Two tiers: packing bit-exact; packed decode attention within a tight tolerance. Skipped cleanly when
triton is absent. Each Triton test's code runs in a process of its own (runtime/kernels/interpreter.py), because
the interpreter switch must be set before triton is imported.
"""

import pytest
from runtime.kernels.interpreter import needs_triton, run_interpreted


@needs_triton
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_triton_pack_is_bit_exact(bits):
    out = run_interpreted(f"""
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
    out = run_interpreted(f"""
        import torch
        from runtime.kernels.packed import packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = packed_cache(bits_k={bits_k}, bits_v={bits_v}, hq={hq})
        a = triton_kernels.decode_attention_in_splits(**args, **kw, n_splits={n_splits})
        b = reference.decode_attention(**args, **kw)
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        assert torch.equal(triton_kernels.decode_attention(**args, **kw),
                           triton_kernels.decode_attention_in_splits(**args, **kw, n_splits=None))
        print("ok", err)
    """)
    assert out.startswith("ok")


@needs_triton
def test_triton_decode_tiles_on_tl_dot_in_16_bits_and_broadcast_below_16():
    """head_dim >= 16: q.K^T and p.V through tl.dot, on tiles dequantized to the query's dtype (fp16 here,
    against the fp32 reference); head_dim 8 is below tl.dot's smallest tile and takes the broadcast sums."""
    out = run_interpreted("""
        import torch
        from runtime.kernels.packed import packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = packed_cache(bits_k=4, bits_v=4, hq=6, d=64, t=96)
        exact = reference.decode_attention(**args, **kw)
        half = dict(args, q=args["q"].half())
        a = triton_kernels.decode_attention_in_splits(**half, **kw, n_splits=2)
        rel = ((a - exact).norm() / exact.norm()).item()
        assert rel < 5e-3, rel
        small, kw8, _ = packed_cache(bits_k=3, bits_v=2, d=8, gv=8)
        err = (triton_kernels.decode_attention(**small, **kw8) - reference.decode_attention(**small, **kw8)).abs().max()
        assert err < 1e-5, err
        print("ok", rel, err.item())
    """)
    assert out.startswith("ok")


@needs_triton
def test_triton_quantize_pack_on_append_is_bit_exact():
    """Head dims of 64 and 32 run the kernels; 96 and 80 (not a power of two) are handed to the reference."""
    out = run_interpreted("""
        import torch
        from sensprof.runtime.kernels import reference, triton_kernels
        g = torch.Generator().manual_seed(0)
        for bits in (2, 3, 4, 5, 8):
            for d in (64, 96):
                x = torch.randn(37, d, generator=g) * 3
                for a, b in zip(triton_kernels.quantize_pack_tokens(x, bits, 32),
                                reference.quantize_pack_tokens(x, bits, 32)):
                    assert torch.equal(a, b), ("tokens", bits, d)
            for d in (32, 80):
                x = torch.randn(5, 64, d, generator=g)
                for a, b in zip(triton_kernels.quantize_pack_channels(x, bits, 32),
                                reference.quantize_pack_channels(x, bits, 32)):
                    assert torch.equal(a, b), ("channels", bits, d)
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
def test_the_store_packs_the_other_codecs_through_triton():
    """Codecs the fused quantizers do not cover (absmax q4_0, per-head int8) are packed by the Triton
    pack_bitplanes, head dim 96 by the reference's; the codes are the reference store's."""
    out = run_interpreted("""
        import torch
        from sensprof.runtime.kernels import triton_kernels
        from sensprof.runtime.store import TensorStore
        from sensprof.schemes import get_scheme
        calls = []

        class Counted:  # the launches of the pack kernel
            def __getitem__(self, grid, kernel=triton_kernels._pack_kernel):
                calls.append(grid)
                return kernel[grid]

        triton_kernels._pack_kernel = Counted()
        g = torch.Generator().manual_seed(1)
        for name, d in (("q4_0", 64), ("int8_per_token_head", 64), ("q4_0", 96)):
            x = torch.randn(2, 3, 40, d, generator=g) * 2
            stores = [TensorStore(get_scheme(name), kernels=k) for k in ("triton", "reference")]
            for s in stores:
                s.append(x[..., :17, :])
                s.append(x[..., 17:, :])
            assert stores[0].kernels is triton_kernels
            for a, b in zip(stores[0].chunks, stores[1].chunks):
                assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale), name
            assert torch.equal(stores[0].dense(), stores[1].dense())
        assert len(calls) == 4, calls  # two appends each of the two head-dim-64 schemes
        print("ok")
    """)
    assert out.strip() == "ok"


@needs_triton
def test_triton_decode_attention_reads_token_slices_of_the_cache_in_place():
    """The runtime passes views (the positions both K and V hold packed); strides, not copies."""
    out = run_interpreted("""
        import torch
        from runtime.kernels.packed import packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = packed_cache(t=96)
        a0, a1 = 32, 96
        args.update(k=args["k"].narrow(a0, a1), v=args["v"].narrow(a0, a1))
        assert not args["k"].codes.is_contiguous()
        a = triton_kernels.decode_attention_in_splits(**args, **kw, n_splits=2)
        b = reference.decode_attention(**args, **kw)
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        print("ok", err)
    """)
    assert out.startswith("ok")


@needs_triton
def test_planned_cache_decodes_through_the_triton_kernels_as_through_the_reference():
    """End to end in the interpreter: quantize-and-pack on append and packed decode attention, both Triton."""
    out = run_interpreted("""
        import torch
        from conftest import make_tiny_model
        from runtime.plans import decode_logprobs, make_plan
        from sensprof.runtime import PlannedCache
        from sensprof.runtime.kernels import triton_kernels
        model = make_tiny_model("llama")
        plan = make_plan(model, [("int4_c32", "int4_t32"), ("int2_c32_r8", "int3_t32_s2"), ("none", "int8_t32")],
                         [{}] * 3)
        ids = torch.randint(3, 300, (2, 72), generator=torch.Generator().manual_seed(5))
        ref = decode_logprobs(model, PlannedCache.from_plan(plan, model, kernels="reference"), ids)
        cache = PlannedCache.from_plan(plan, model, kernels="triton")
        got = decode_logprobs(model, cache, ids)
        assert cache.layers[0].kernels is triton_kernels and cache.layers[0].k_store.kernels is triton_kernels
        assert cache.layers[0].packed_steps > 0 and cache.layers[1].packed_steps > 0
        err = (got - ref).abs().max().item()
        assert err < 1e-4, err
        print("ok", err)
    """)
    assert out.startswith("ok")


@needs_triton
@pytest.mark.parametrize("table_batch", [1, 2])
def test_triton_decode_rotates_keys_stored_before_rope_with_a_table_the_batch_shares(table_batch):
    """Keys stored before RoPE over their first 24 of 32 channels (partial rotary), for a batch of 2: one RoPE table
    per row, or one [1, T, R/2] table every row shares (the runtime's, positions alike), which broadcasts."""
    out = run_interpreted(f"""
        import dataclasses
        import torch
        from runtime.kernels.packed import packed_cache
        from sensprof.runtime.kernels import reference, triton_kernels
        args, kw, _ = packed_cache(b=2, t=64, d=32)
        pos = torch.arange(64, dtype=torch.float32)[None, :, None] * torch.tensor([1.0, 0.3, 0.1, 0.03, 0.01,
                                                                                   0.003, 0.001, 3e-4, 1e-4, 3e-5,
                                                                                   1e-5, 3e-6])
        cos, sin = pos.cos().repeat({table_batch}, 1, 1), pos.sin().repeat({table_batch}, 1, 1)
        args["k"] = dataclasses.replace(args["k"], rope=(cos, sin))
        a = triton_kernels.decode_attention_in_splits(**args, **kw, n_splits=2)
        b = reference.decode_attention(**args, **kw)
        plain = dict(args, k=dataclasses.replace(args["k"], rope=None))
        assert (reference.decode_attention(**plain, **kw) - b).abs().max() > 1e-2  # the rotation matters
        err = (a - b).abs().max().item()
        assert err < 1e-5, err
        print("ok", err)
    """)
    assert out.startswith("ok")
