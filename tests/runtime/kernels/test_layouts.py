"""Every layout the store packs (contract.PackedRead), decoded by each kernel backend as by the reference.

The reads come from real stores (TensorStore of each scheme, appended in two parts), over the tokens both a key
and a value store hold packed: per channel and per token integers, llama.cpp's blocks, per tensor, per head and
per token-head, fp8 bytes, sinks with a residual. Each backend reads them in place (the compiled one without
handing anything to the reference), with read masks (left padding per row, a sliding window, a row with no
packed token read), keys stored before RoPE, GQA (3 query heads per KV head), head dims 64 and 32, token slices
(strided views) and split-K across threads. The Triton kernel runs under TRITON_INTERPRET=1 in a subprocess.
"""

from dataclasses import replace

import pytest
import torch
from runtime.kernels.packed import LAYOUTS, OCTAVE_PAIRS, rope_tables, store_reads
from runtime.kernels.interpreter import needs_triton, run_interpreted

from sensprof.runtime.kernels import cpu_kernels, dense_read, reference

needs_compiler = pytest.mark.skipif(cpu_kernels.available() is not None,
                                    reason=f"the compiled CPU kernels cannot build here: {cpu_kernels.available()}")
# every key layout with a value layout of another kind (channel keys with token values, fp8 with integers, ...)
PAIRS = [(k, LAYOUTS[(i + 5) % len(LAYOUTS)]) for i, k in enumerate(LAYOUTS)]


def masks(b, n, tail, window=None):
    """Read masks [B, n + tail] (packed tokens, then the tail): the last row left-padded past a third of the
    packed tokens, the middle one (B >= 3) reading no packed token at all; with `window`, only the last
    `window` packed tokens are read."""
    m = torch.ones(b, n + tail, dtype=torch.bool)
    m[-1, :n // 3 + 5] = False
    if b >= 3:
        m[1, :n] = False
    if window is not None:
        m[:, :n - window] = False
    return m


def _read_by_c(args, kw):
    """cpu_kernels.decode_attention, asserting that the reference is not asked to do it."""
    def refused(*a, **k):
        raise AssertionError("the C kernels handed this layout to the reference")

    saved, cpu_kernels.reference.decode_attention = cpu_kernels.reference.decode_attention, refused
    try:
        return cpu_kernels.decode_attention(**args, **kw)
    finally:
        cpu_kernels.reference.decode_attention = saved


def _check_c(args, kw, tol=1e-4):
    want = reference.decode_attention(**args, **kw)
    got = _read_by_c(args, kw)
    assert got.shape == want.shape and got.dtype == torch.float32
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    err = (got - want)[finite].abs().max().item()
    assert err < tol, err


@needs_compiler
@pytest.mark.parametrize("k_name,v_name", [(n, n) for n in LAYOUTS] + PAIRS, ids=lambda n: n)
def test_every_layout_decodes_through_the_c_kernels(k_name, v_name):
    for d, mask in ((64, None), (32, "padding"), (64, "window")):
        args, kw = store_reads(k_name, v_name, b=3, hq=6, hkv=2, t=300, tail=5, d=d, seed=d)
        n = args["k"].tokens
        if mask:
            kw = dict(kw, mask=masks(3, n, 5, window=n // 2 if mask == "window" else None))
        _check_c(args, kw)


@needs_compiler
@pytest.mark.parametrize("hq,hkv", [(2, 2), (20, 2)], ids=["mha", "rep10"])
def test_query_heads_per_kv_head_beyond_the_register_loops(hq, hkv):
    """One query head per KV head, and 10 (more than the loops keep in registers: the plain loops)."""
    for k_name, v_name in (("int3_c128", "q4_1"), ("q4_0", "int5_t64"), ("fp8_e4m3", "int2_c32_r32_s4")):
        args, kw = store_reads(k_name, v_name, b=2, hq=hq, hkv=hkv, t=300, d=64)
        _check_c(args, dict(kw, mask=masks(2, args["k"].tokens, 5)))
        args["k"] = replace(args["k"], rope=rope_tables(2, args["k"].tokens, 64))
        _check_c(args, kw)


@needs_compiler
@pytest.mark.parametrize("k_name", LAYOUTS)
def test_keys_stored_before_rope_are_rotated_in_the_c_kernels(k_name):
    """RoPE over every channel and over the first half (partial rotary), at random positions per sequence."""
    for d, r in ((64, 64), (64, 32), (32, 32)):
        args, kw = store_reads(k_name, "q8_0" if k_name != "q8_0" else "int4_t32", b=2, t=300, d=d, seed=r)
        cos, sin = rope_tables(2, args["k"].tokens, r, seed=d)
        args["k"] = replace(args["k"], rope=(cos, sin))
        _check_c(args, kw)
        _check_c(args, dict(kw, mask=masks(2, args["k"].tokens, 5)))


@needs_compiler
@pytest.mark.parametrize("k_name,v_name", [("int4_c32", "int4_t32"), ("q4_0", "fp8_e4m3_head"),
                                           ("int3_c128", "int8_per_token_head")])
def test_token_slices_are_read_in_place(k_name, v_name):
    """The runtime passes views of the store's buffers (a window's span, the overlap of K and V): strided reads,
    with RoPE tables sliced alongside."""
    args, kw = store_reads(k_name, v_name, b=2, hq=6, hkv=2, t=420, d=64)
    k, v = args["k"], args["v"]
    k = replace(k, rope=rope_tables(2, k.tokens, 64))
    lo = max(k.token_group, v.token_group)
    sliced = dict(args, k=k.narrow(lo, k.tokens - 3), v=v.narrow(lo, v.tokens - 3))
    assert not sliced["k"].codes.is_contiguous() and not sliced["v"].codes.is_contiguous()
    _check_c(sliced, kw)
    _check_c(sliced, dict(kw, mask=masks(2, sliced["k"].tokens, 5)))


@needs_compiler
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_long_masked_contexts_split_across_threads(threads, monkeypatch):
    """Split-K over any layout: slices wholly masked (left padding, a window) merge as empty, on the KIVI and the
    generic path alike."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: threads)
    for k_name, v_name in (("int4_c32", "int4_t32"), ("q4_1", "int8_t32"), ("fp8_e4m3", "q5_0")):
        args, kw = store_reads(k_name, v_name, b=3, hq=9, hkv=3, t=2200, tail=17, d=64)
        n = args["k"].tokens
        for mask in (None, masks(3, n, 17), masks(3, n, 17, window=300)):
            _check_c(args, dict(kw, mask=mask))


@needs_compiler
def test_the_generic_path_matches_without_native_instructions(tmp_path, monkeypatch):
    """Built without -march=native: the portable dequantization (scalar fp16, no gathers) of every kind."""
    monkeypatch.setenv("SENSPROF_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "_VARIANTS", ([],))
    cpu_kernels._load.cache_clear()
    try:
        assert cpu_kernels.available() is None
        for k_name, v_name in (("int4_t32", "int3_c128"), ("fp8_e4m3_head", "q4_0"), ("int8", "fp8_per_token_head"),
                               ("int3_c128", "int4_t32"), ("int4_per_token_head", "none"), ("none", "int4_per_token_head"),
                               ("octave_k3v4.K", "octave_k3v3.V")):
            args, kw = store_reads(k_name, v_name, b=2, t=300, d=64)
            args["k"] = replace(args["k"], rope=rope_tables(2, args["k"].tokens, 32))
            _check_c(args, dict(kw, mask=masks(2, args["k"].tokens, 5)))
        for dtype in (torch.float16, torch.bfloat16):  # an unquantized side in a 16-bit model
            args, kw = store_reads("none", "none", b=2, t=100, d=64)
            held = dense_read(args["v"].codes.to(dtype))
            _check_c(dict(args, k=replace(held, codes=held.codes * 2), v=held), kw)
    finally:
        cpu_kernels._load.cache_clear()


_TRITON_CHECK = """
    import torch
    from dataclasses import replace
    from runtime.kernels.packed import LAYOUTS, OCTAVE_PAIRS, rope_tables, store_reads
    from runtime.kernels.test_layouts import PAIRS, masks
    from sensprof.runtime.kernels import reference, triton_kernels

    def refused(*a, **k):
        raise AssertionError("the Triton kernel handed this layout to the reference")

    oracle = reference.decode_attention
    triton_kernels.reference.decode_attention = refused
    worst = 0.0

    def check(args, kw, n_splits=2, tol=1e-5):
        global worst
        want = oracle(**args, **kw)
        got = triton_kernels.decode_attention_in_splits(**args, **kw, n_splits=n_splits)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got))
        # relative to the output's size where it exceeds 1 (vLLM's unnormalised rotation scales values by sqrt(D))
        err = ((got - want)[finite].abs().max() / want[finite].abs().max().clamp(min=1.0)).item()
        assert err < tol, err
        worst = max(worst, err)
"""


@needs_triton
@pytest.mark.parametrize("part", [0, 1])
def test_every_layout_decodes_through_the_triton_kernel(part):
    """Each layout as keys and values, with and without a padding mask (one row reading no packed token); half the
    layouts a subprocess (the interpreter runs each program op by op)."""
    out = run_interpreted(_TRITON_CHECK + f"""
    for name in LAYOUTS[{part}::2]:
        args, kw = store_reads(name, name, b=3, hq=6, hkv=2, t=140, tail=3, d=32)
        check(args, kw)
        check(args, dict(kw, mask=masks(3, args["k"].tokens, 3)))
    print("ok", worst)
    """)
    assert out.startswith("ok")


@needs_triton
def test_mixed_layouts_rope_and_windows_through_the_triton_kernel():
    """Key and value layouts of different kinds, keys stored before RoPE (whole and partial rotary), a sliding
    window's mask, head dim 64."""
    out = run_interpreted(_TRITON_CHECK + """
    for i, (k_name, v_name) in enumerate(PAIRS):
        d = 64 if i % 2 else 32
        args, kw = store_reads(k_name, v_name, b=2, hq=6, hkv=2, t=140, tail=3, d=d, seed=i)
        n = args["k"].tokens
        args["k"] = replace(args["k"], rope=rope_tables(2, n, d if i % 3 else d // 2, seed=i))
        check(args, dict(kw, mask=masks(2, n, 3, window=n // 2)) if i % 2 else kw)
    print("ok", worst)
    """)
    assert out.startswith("ok")


@needs_triton
def test_octave_layouts_decode_through_the_triton_kernel():
    """Octave's wide key reads and codebook values (head dim 64), with a padding mask."""
    out = run_interpreted(_TRITON_CHECK + """
    from runtime.kernels.packed import OCTAVE_PAIRS
    for k_name, v_name in OCTAVE_PAIRS:
        args, kw = store_reads(k_name, v_name, b=2, hq=6, hkv=2, t=100, tail=3, d=64)
        check(args, kw)
        check(args, dict(kw, mask=masks(2, args["k"].tokens, 3)))
    print("ok", worst)
    """)
    assert out.startswith("ok")


@needs_triton
def test_triton_reads_token_slices_in_place_and_tiles_in_16_bits():
    """Strided token slices (with their RoPE tables) across several splits; an fp16 query dequantizes the tiles to
    fp16 for tl.dot (within fp16 rounding of the fp32 reference)."""
    out = run_interpreted(_TRITON_CHECK + """
    for k_name, v_name in (("int4_c32", "int4_t32"), ("q4_0", "fp8_e4m3_head"), ("int3_c128", "q8_0")):
        args, kw = store_reads(k_name, v_name, b=2, hq=6, hkv=2, t=300, tail=3, d=32)
        k, v = args["k"], args["v"]
        k = replace(k, rope=rope_tables(2, k.tokens, 32))
        lo = max(k.token_group, v.token_group)
        sliced = dict(args, k=k.narrow(lo, k.tokens - 3), v=v.narrow(lo, v.tokens - 3))
        assert not sliced["k"].codes.is_contiguous()
        for n_splits in (1, 3):
            check(sliced, dict(kw, mask=masks(2, sliced["k"].tokens, 3)), n_splits=n_splits)
    args, kw = store_reads("q4_1", "fp8_e4m3", b=2, hq=6, hkv=2, t=140, tail=3, d=64)
    exact = oracle(**args, **kw)
    half = triton_kernels.decode_attention_in_splits(**dict(args, q=args["q"].half()), **kw, n_splits=2)
    rel = ((half - exact).norm() / exact.norm()).item()
    assert rel < 5e-3, rel
    print("ok", worst, rel)
    """)
    assert out.startswith("ok")


@needs_compiler
def test_a_plan_of_mixed_layouts_decodes_through_the_c_kernels_as_through_the_reference(monkeypatch):
    """End to end: every layer's decode steps read packed by the C kernels (none handed to the reference), with
    llama.cpp blocks, fp8 bytes, per-token-head and per-channel layouts, as the reference reads them."""
    from conftest import make_tiny_model
    from runtime.plans import decode_logprobs, make_plan

    from sensprof.runtime import PlannedCache

    model = make_tiny_model("llama")
    kv_heads = model.config.num_key_value_heads
    plan = make_plan(model, [("q4_0", "fp8_e4m3"), ("int4_t32", "int8_per_token_head"), ("fp8_e4m3_head", "int3_c128")],
                     [{}, {}, {"K": [3.0] * kv_heads}])  # per-head fp8 scales from calibrated absmax
    ids = torch.randint(3, 300, (2, 160), generator=torch.Generator().manual_seed(7))
    ref = decode_logprobs(model, PlannedCache.from_plan(plan, model, kernels="reference"), ids)

    def refused(*a, **k):
        raise AssertionError("the C kernels handed a decode step to the reference")

    monkeypatch.setattr(reference, "decode_attention", refused)
    cache = PlannedCache.from_plan(plan, model, kernels="cpu")
    got = decode_logprobs(model, cache, ids)
    assert all(layer.kernels is cpu_kernels and layer.packed_steps > 0 for layer in cache.layers)
    assert (got - ref).abs().max().item() < 1e-4


@needs_triton
def test_a_plan_of_mixed_layouts_decodes_through_the_triton_kernel_as_through_the_reference():
    """End to end in the interpreter: every layer's decode steps read packed by the Triton kernel."""
    out = run_interpreted("""
        import torch
        from conftest import make_tiny_model
        from runtime.plans import decode_logprobs, make_plan
        from sensprof.runtime import PlannedCache
        from sensprof.runtime.kernels import reference, triton_kernels
        model = make_tiny_model("llama")
        kv_heads = model.config.num_key_value_heads
        plan = make_plan(model, [("q4_0", "fp8_e4m3"), ("int4_t32", "int8_per_token_head"), ("fp8_e4m3_head", "q8_0")],
                         [{}, {}, {"K": [3.0] * kv_heads}])
        ids = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(7))
        ref = decode_logprobs(model, PlannedCache.from_plan(plan, model, kernels="reference"), ids)

        def refused(*a, **k):
            raise AssertionError("the Triton kernel handed a decode step to the reference")

        reference.decode_attention = refused
        cache = PlannedCache.from_plan(plan, model, kernels="triton")
        got = decode_logprobs(model, cache, ids)
        assert all(layer.kernels is triton_kernels and layer.packed_steps > 0 for layer in cache.layers)
        err = (got - ref).abs().max().item()
        assert err < 1e-4, err
        print("ok", err)
    """)
    assert out.startswith("ok")


@needs_compiler
@pytest.mark.parametrize("k_name,v_name", OCTAVE_PAIRS, ids=lambda n: n)
@pytest.mark.parametrize("d", [64, 128])
def test_octave_layouts_decode_through_the_c_kernels(k_name, v_name, d):
    """Octave's wide reads (one more code bit on the rotary dims, a second codebook on the rest) and codebook
    values, read by the C kernels themselves, with masks and GQA."""
    args, kw = store_reads(k_name, v_name, b=3, hq=6, hkv=2, t=150, tail=4, d=d)
    assert args["k"].wide == (0 if "compact" in k_name else 64)
    _check_c(args, kw)
    _check_c(args, dict(kw, mask=masks(3, args["k"].tokens, 4)))


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_an_unquantized_side_in_the_models_dtype_is_read_as_held(dtype, monkeypatch):
    """dense_read of fp32 / fp16 / bf16 values (a layer's unquantized K or V), strided as the store's buffer is,
    against int4 per-token values (and as values, against q4_0 keys), with a mask: the C kernels (AVX2 and the
    portable loops) read it in place, as the reference does."""
    g = torch.Generator().manual_seed(3)
    held = (torch.randn(2, 2, 200, 64, generator=g) * 3).to(dtype)[:, :, 7:177]  # a view into a larger buffer
    args, kw = store_reads("int4_t32", "int4_t32", b=2, hq=6, hkv=2, t=170, tail=4, d=64)
    for k, v in ((dense_read(held), args["v"]), (args["k"], dense_read(held))):
        case = dict(args, k=k, v=v)
        _check_c(case, kw)
        _check_c(case, dict(kw, mask=masks(2, 170, 4)))


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_every_fp8_byte_reads_as_its_table_value(dtype):
    """fp8 tables are converted in registers (through fp16), not looked up: each of the 256 byte patterns
    (subnormals, both zeros, infinities and NaNs included) reads as its table entry. One value token read at a
    time, so the output is that token's row."""
    from sensprof.runtime.kernels.contract import PackedRead

    lut = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(1, 1, 4, 64)

    def read(c):
        return PackedRead(codes=c, scale=torch.ones(1, 1, 1, 1).expand(1, 1, 4, 1), zero=None, lut=lut, bits=8,
                          token_group=1, channel_group=64, packing="bytes")

    assert cpu_kernels._fp8_kind(read(codes), lut) in (1, 2)
    empty = torch.zeros(1, 1, 0, 64)
    for t in range(4):
        mask = torch.zeros(1, 4, dtype=torch.bool)
        mask[0, t] = True
        args = dict(q=torch.zeros(1, 2, 64), k=read(torch.zeros_like(codes)), v=read(codes), k_tail=empty,
                    v_tail=empty)
        got = _read_by_c(args, dict(scaling=1.0, mask=mask))
        want = lut[codes[0, 0, t].long()].expand(2, 64)
        assert torch.allclose(got[0], want, rtol=0, atol=0, equal_nan=True), t
