"""sensprof.profiling.suffix and first_quantized_row: cells replay only the positions a quantized read can reach."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHS, VOCAB, make_tiny_model

import sensprof.profiling.profile as profile_mod
import sensprof.profiling.suffix as suffix_mod
from sensprof.models import decoder_layers
from sensprof.profiling.profile import run_profile
from sensprof.schemes import get_scheme, parse_schemes
from sensprof.profiling.taps import first_quantized_row, quantized_reads

N = 64


@pytest.mark.parametrize("name, first", [
    ("int4_c32", 31),  # the first group of 32 keys is complete when query 31 reads it
    ("int4_c32_s4", 35),  # counted from the first non-sink token
    ("int3_c32_r32_s4", 67),  # ... and only once it has left the 32-token window
    ("int4_c128", N),  # a group longer than the window never completes: nothing is read quantized
    ("int4_t32", 0),  # per-token values are quantized as they enter
    ("int4_t32_r16", 16),
    ("fp8_e4m3_cal", 0),
])
def test_first_quantized_row(name, first):
    scheme = get_scheme(name)
    n = 128 if first > N else N
    assert first_quantized_row([(scheme, None)], n) == first
    assert first_quantized_row([(None, scheme)], n) == first
    reads = quantized_reads(scheme, n)
    rows = torch.ones(n, dtype=torch.bool) if reads is None else reads.any(-1)
    assert not rows[:first].any() and (first == n or rows[first:].all())  # once reached, every later query reads one


def test_first_quantized_row_of_several_pairs_is_the_earliest():
    pairs = [(get_scheme("int4_c32"), None), (None, get_scheme("int4_t32_r16")), (None, None)]
    assert first_quantized_row(pairs, N) == 16
    assert first_quantized_row([(None, None)], N) == N


def test_sink_tokens_are_never_read_quantized():
    reads = quantized_reads(get_scheme("int2_c32_r32_s4"), 128)
    assert not reads[:, :4].any() and reads[100, 4:68].all() and not reads[100, 68:].any()  # groups 4-35, 36-67


def test_a_query_transform_moves_every_position():
    scheme = get_scheme("fp8_e4m3_qfp8")  # vLLM Hopper: the query is cast to fp8 too
    assert scheme.query
    assert first_quantized_row([(scheme, None)], N) == 0


SCHEMES = "int4_c32,int2_c32_r16_s4,int4_t32_r16,int2_t32"


@pytest.mark.parametrize("arch", ARCHS)
def test_suffix_replay_gives_the_table_of_whole_replays(arch, monkeypatch):
    """Positions before the first quantized read are the baseline's: replaying the rest only changes nothing."""
    model = make_tiny_model(arch)
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(0))
    schemes = parse_schemes(SCHEMES)
    calls, lengths = [], []
    real = suffix_mod.replay_suffix

    def counting(model, session, layer, start, *a, **k):
        calls.append((layer, start))
        return real(model, session, layer, start, *a, **k)

    last = decoder_layers(model)[-1]
    handle = last.register_forward_pre_hook(lambda m, args, kw: lengths.append(
        (kw.get("hidden_states") if kw.get("hidden_states") is not None else args[0]).shape[1]), with_kwargs=True)
    monkeypatch.setattr(profile_mod, "replay_suffix", counting)
    try:
        short = run_profile(model, ids, schemes, progress=False)
        assert sorted(set(s for _, s in calls)) == [16, 31, 51]  # int4_t32_r16, int4_c32, int2_c32_r16_s4 (not int2_t32)
        assert min(lengths) == N - 51 and max(lengths) == N  # the last layer really ran on fewer positions
        monkeypatch.setattr(profile_mod, "SUFFIX_REPLAY", False)
        n_calls = len(calls)
        whole = run_profile(model, ids, schemes, progress=False)
        assert len(calls) == n_calls
    finally:
        handle.remove()
    assert short.meta["attention"] == {"untapped": "sdpa", "suffix_replay": True}
    assert whole.meta["attention"]["suffix_replay"] is False
    keys = ["layer", "tensor", "scheme"]
    a = short.table.sort_values(keys).reset_index(drop=True)
    b = whole.table.sort_values(keys).reset_index(drop=True)
    assert a[keys].equals(b[keys])
    for col in ("kl", "kl_std", "dnll", "attn_kl", "out_rel_l2"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-5, atol=1e-9, err_msg=col)
    assert (a["kl"] > 0).all()


def test_suffix_replay_with_batched_variants(monkeypatch):
    model = make_tiny_model("qwen3")
    ids = torch.randint(3, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
    schemes = parse_schemes("int4_c32,int4_c32_pre,int2_c32_s4")
    batched = run_profile(model, ids, schemes, variants_per_pass=2, progress=False).table
    monkeypatch.setattr(profile_mod, "SUFFIX_REPLAY", False)
    whole = run_profile(model, ids, schemes, progress=False).table
    np.testing.assert_allclose(batched["kl"], whole["kl"], rtol=1e-5, atol=1e-9)


def test_stop_after_runs_only_up_to_the_layer():
    model = make_tiny_model("llama")
    ran = []
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i)) for i, layer in
               enumerate(decoder_layers(model))]
    try:
        with torch.no_grad(), suffix_mod.stop_after(model, 1) as box:
            model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1] and box["out"] is not None
