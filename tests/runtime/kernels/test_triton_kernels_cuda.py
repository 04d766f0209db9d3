"""The Triton kernels compiled for a CUDA device against their PyTorch references (run on the GPU too).

test_triton_kernels.py checks the same kernels under TRITON_INTERPRET=1, which neither compiles them nor runs
the GPU's own conversions and tensor-core dot products; these run only where torch sees a CUDA device (marked
gpu) and are skipped elsewhere.
"""

import pytest
import torch
from runtime.kernels.packed import packed_cache

from sensprof.runtime.kernels import reference, triton_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()),
                                 reason="needs a CUDA device and triton")]
CUDA = "cuda"


def _triton():
    from sensprof.runtime.kernels import triton_kernels

    return triton_kernels


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_pack_is_bit_exact_on_the_gpu(bits):
    codes = torch.randint(0, 2 ** bits, (3, 5, 64), generator=torch.Generator().manual_seed(bits),
                          dtype=torch.uint8)
    got = _triton().pack_bitplanes(codes.to(CUDA), bits)
    assert torch.equal(got.cpu(), reference.pack_bitplanes(codes, bits))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_quantize_pack_on_append_is_bit_exact_on_the_gpu(bits):
    """The fused quantizers round on the GPU as the reference rounds on the CPU (a division by the scale,
    then round-half-even): not one code apart."""
    g = torch.Generator().manual_seed(bits)
    for d in (64, 128):
        x = torch.randn(37, d, generator=g) * 3
        for a, b in zip(_triton().quantize_pack_tokens(x.to(CUDA), bits, 32), reference.quantize_pack_tokens(x, bits, 32)):
            assert torch.equal(a.cpu(), b), ("tokens", bits, d)
        y = torch.randn(5, 64, d // 2, generator=g)
        for a, b in zip(_triton().quantize_pack_channels(y.to(CUDA), bits, 32),
                        reference.quantize_pack_channels(y, bits, 32)):
            assert torch.equal(a.cpu(), b), ("channels", bits, d)


@pytest.mark.parametrize("bits_k,bits_v,n_splits,hq,d", [(4, 2, 1, 4, 32), (3, 4, 2, 6, 64), (2, 8, 3, 2, 128),
                                                          (4, 4, 4, 24, 128)])
def test_decode_attention_matches_the_reference_on_the_gpu(bits_k, bits_v, n_splits, hq, d):
    """fp32 query: tl.dot in fp32 may take TF32 on the GPU, so the bound is TF32's, not the interpreter's 1e-5."""
    args, kw, _ = packed_cache(bits_k=bits_k, bits_v=bits_v, hq=hq, d=d, t=128, device=CUDA)
    got = _triton().decode_attention_in_splits(**args, **kw, n_splits=n_splits)
    want = reference.decode_attention(**args, **kw)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 2e-3, rel


def test_half_precision_queries_tile_on_tensor_cores_within_fp16_rounding():
    args, kw, _ = packed_cache(bits_k=4, bits_v=4, hq=6, d=64, t=96, device=CUDA)
    exact = reference.decode_attention(**args, **kw)
    for dtype in (torch.float16, torch.bfloat16):
        got = _triton().decode_attention_in_splits(**dict(args, q=args["q"].to(dtype)), **kw, n_splits=2)
        rel = ((got.float() - exact).norm() / exact.norm()).item()
        assert rel < 1e-2, (dtype, rel)


def test_token_slices_of_the_cache_are_read_in_place_on_the_gpu():
    args, kw, _ = packed_cache(t=96, device=CUDA)
    args.update(k=args["k"].narrow(32, 96), v=args["v"].narrow(32, 96))
    got = _triton().decode_attention_in_splits(**args, **kw, n_splits=2)
    want = reference.decode_attention(**args, **kw)
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_a_planned_cache_decodes_through_the_compiled_kernels_as_through_the_reference():
    from conftest import make_tiny_model
    from runtime.plans import decode_logprobs, make_plan

    from sensprof.runtime import PlannedCache

    model = make_tiny_model("llama").to(CUDA)
    plan = make_plan(model, [("int4_c32", "int4_t32"), ("int2_c32_r8", "int3_t32_s2"), ("none", "int8_t32")],
                     [{}] * 3)
    ids = torch.randint(3, 300, (2, 72), generator=torch.Generator().manual_seed(5)).to(CUDA)
    ref = decode_logprobs(model, PlannedCache.from_plan(plan, model, kernels="reference"), ids)
    cache = PlannedCache.from_plan(plan, model, kernels="triton")
    got = decode_logprobs(model, cache, ids)
    assert cache.layers[0].kernels is _triton() and cache.layers[0].packed_steps > 0
    assert (got - ref).abs().max().item() < 1e-3
