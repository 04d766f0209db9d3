"""The vLLM target's catalog: every vLLM 0.33 KV dtype maps to schemes whose storage is what vLLM allocates
(facts.py, pinned by vLLM's own page-size code), sensprof's own codecs reproduce vLLM's per-token-head and fp8
writes bit for bit (fixtures from vLLM's Triton kernels), and the target offers each dtype only where vLLM runs it."""

from __future__ import annotations

import os

import pytest
import torch

from sensprof.engines.vllm import catalog, facts
from sensprof.errors import SensprofError
from sensprof.memory import bits_per_element, layer_cache_bits
from sensprof.quant import fake_quant, quantize_groups
from sensprof.scheme_tables import describe_dtypes
from sensprof.schemes import get_scheme
from sensprof import targets
from sensprof.targets import get_target

GOLD = os.path.join(os.path.dirname(__file__), "..", "data", "vllm", "per_token_head.pt")
QUANTIZED = [d for d in facts.DTYPES if d not in facts.NATIVE and d not in ("fp8_e4m3",)]


def _dims(d: catalog.VllmDtype):
    return [h for h in (32, 64, 96, 128, 256, 512) if not d.head_dim_problem(h, "blackwell")]


def test_every_vllm_033_dtype_is_in_the_catalog_or_said_why_not():
    named = {d.flag_value for d in catalog.DTYPES} | set(catalog.OTHER_DTYPES) | {"auto", "float16", "bfloat16"}
    assert set(facts.DTYPES) <= named
    from sensprof.export.vllm import VLLM_KV_DTYPES

    assert set(VLLM_KV_DTYPES) <= named | {"fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla"}


@pytest.mark.parametrize("dtype", [d for d in catalog.DTYPES if not d.needs_scales], ids=lambda d: d.name)
def test_k_plus_v_storage_is_what_vllm_allocates(dtype):
    """bits_per_element of the K and V schemes, over a token, equals vLLM's slot (page_size_bytes at block 1)."""
    rope = catalog.OCTAVE_ROPE_DIM if dtype.name.startswith("octave") else None
    for gpu in dtype.gpus:
        k, v = dtype.schemes_on(gpu)
        for h in _dims(dtype):
            ours = (bits_per_element(get_scheme(k), h) + bits_per_element(get_scheme(v), h)) * h / 8
            assert ours == facts.slot_bytes(dtype.flag_value, h, rope_dim=rope).total, (dtype.name, gpu, h)
            # a whole layer after n tokens: no residual, no sinks, every token at the slot size
            n, heads = 37, 3
            layer = layer_cache_bits(get_scheme(k), n, heads, h) + layer_cache_bits(get_scheme(v), n, heads, h)
            assert layer / 8 == pytest.approx(n * facts.page_bytes_per_token(dtype.flag_value, heads, h, rope_dim=rope),
                                              rel=1e-12)


def test_forced_boundary_layers_are_vllms():
    for d in catalog.DTYPES:
        e = next(iter(targets.engine_dtypes(sorted(d.gpus)[0])), None)
        assert e is not None
        for n in range(1, 41):
            want = [int(i) for i in facts.effective_skip_layers(d.flag_value, [], n)]
            got = targets.engine_dtypes(sorted(d.gpus)[0])
            mine = next(x for x in got if x.flag_value == d.flag_value and x.needs_scales == d.needs_scales)
            assert mine.forced_skips(n) == sorted(want), (d.name, n)


def test_the_target_offers_what_runs_on_each_gpu():
    hopper64 = {d.flag_value: d for d in get_target("vllm", "hopper", head_dims={64}).dtypes if not d.needs_scales}
    assert "nvfp4" not in hopper64  # FlashInfer refuses head_dim 64 off Blackwell
    assert hopper64["fp8"].k_scheme == "fp8_e4m3_qfp8" and hopper64["fp8"].v_scheme == "fp8_e4m3"
    assert hopper64["turboquant_k3v4_nc"].schemes == ("turboquant_k3v4_nc.K", "turboquant_k3v4_nc.V")
    assert hopper64["turboquant_k3v4_nc"].boundary_skip == 2 and hopper64["int4_per_token_head"].boundary_skip == 0
    assert not any(n.startswith(("octave", "ultraquant")) for n in hopper64)
    ampere = {d.flag_value: d for d in get_target("vllm", "ampere", head_dims={128}).dtypes if not d.needs_scales}
    assert ampere["turboquant_k8v4"].k_scheme == "turboquant_k8v4_e4b15.K"
    assert ampere["fp8"].k_scheme == "fp8_e4m3" and "fp8_per_token_head" not in ampere and "nvfp4" in ampere
    blackwell = {d.flag_value for d in get_target("vllm", "blackwell", head_dims={64}).dtypes}
    assert {"nvfp4", "nvfp4_4over6"} <= blackwell
    rocm = {d.flag_value for d in get_target("vllm", "rocm", head_dims={256}).dtypes}
    assert {"octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit"} <= rocm
    assert not {n for n in {d.flag_value for d in get_target("vllm", "rocm", head_dims={64}).dtypes}
                if n.startswith("octave")}
    assert get_target("vllm", "hopper", head_dims={16}).dtypes  # fp8 still runs; per-token-head needs >= 32
    assert "int8_per_token_head" not in {d.flag_value for d in get_target("vllm", "hopper", head_dims={16}).dtypes}


def test_describe_lists_every_dtype_with_bits_and_gpus():
    text = describe_dtypes()
    for d in catalog.DTYPES:
        assert d.flag_value in text
    assert "turboquant_k3v4_nc" in text and "3.25/3.12" in text and "vLLM keeps the first and last 2 layers" in text
    assert "not on hopper,ampere,blackwell" in text and "MLA models only" in text
    assert "checked: golden: vLLM's Triton write kernel" in text and "checked: from source only" in text
    with pytest.raises(SensprofError, match="unknown --vllm-gpu 'tpu'"):
        describe_dtypes("tpu")


@pytest.fixture(scope="module")
def gold():
    return torch.load(GOLD, weights_only=False)


@pytest.mark.parametrize("d", (64, 96, 128, 256))
@pytest.mark.parametrize("name, key", [("int8_per_token_head", "int8"), ("fp8_per_token_head", "fp8")])
def test_sensprofs_per_token_head_codecs_are_vllms_write(gold, d, name, key):
    """int8/fp8_per_token_head stay sensprof's own codecs (the runtime stores them): codes and fp32 scales equal
    what vLLM's Triton write kernel stored, zero, tiny and constant heads included."""
    case = gold[d]
    for t in "kv":
        q = quantize_groups(case[t].float().unsqueeze(-2), get_scheme(name))  # [tokens, heads, 1 group, D]
        codes, want = q.codes.squeeze(-2), case[key][f"{t}_codes"]
        if key == "int8":
            assert torch.equal(codes.to(torch.int8), want)
        else:
            assert torch.equal(codes.view(torch.uint8), want.view(torch.uint8))
        scale = case[key][f"{t}_scale"].float()
        assert torch.equal(q.scale.reshape(scale.shape).view(torch.int32), scale.view(torch.int32))
        read = fake_quant(case[t].float().transpose(0, 1).unsqueeze(0), get_scheme(name))[0].transpose(0, 1)
        assert torch.equal(read, want.float() * scale.unsqueeze(-1))


@pytest.mark.parametrize("case_name", ["plain_e4m3", "plain_e4m3_s"])
def test_plain_fp8_write_is_vllms(gold, case_name):
    """fp8 with vLLM's k_scale/v_scale (fp32; 1.0 unless a checkpoint has scales): vLLM divides by the scale, a true
    division, and casts with saturation; the calibrated scheme with absmax = scale * 448 stores the same bytes."""
    case = gold[64]
    for t in "kv":
        s = torch.tensor(float(case[case_name][f"{t}_scale"]), dtype=torch.float32)
        absmax = s * 448.0
        assert torch.equal(absmax / 448.0, s)  # the calibrated scheme recovers exactly this scale
        got = quantize_groups(case[t].float(), get_scheme("fp8_e4m3_cal"), absmax).codes
        assert torch.equal(got.view(torch.uint8), case[case_name][f"{t}_codes"].view(torch.uint8))
        if float(s) == 1.0:
            unit = quantize_groups(case[t].float(), get_scheme("fp8_e4m3")).codes
            assert torch.equal(unit.view(torch.uint8), case[case_name][f"{t}_codes"].view(torch.uint8))
