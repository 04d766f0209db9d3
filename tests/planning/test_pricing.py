"""Damage priced for the reads a plan will get (sensprof.planning.pricing): the profiler's two read regimes on tiny random
models, the scale from a profile's window to the serving length, and the planner's refusals."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from conftest import VOCAB, make_tiny_model, one_error_line, run_cli

from sensprof.planning.budget import Budget
from sensprof.errors import SensprofError
from sensprof.planning.plan import make_plan
from sensprof.planning.pricing import (DEFAULT_CONTEXT_LEN, moved_share, needed_len, outgrown_windows_note, price,
                                       priced_at, scale, serving_context, slid_layers, without_sinks)
from sensprof.profiling.profile import run_profile
from sensprof.schemes import get_scheme, parse_schemes
from sensprof.profiling.taps import first_quantized_row, quantized_reads
from sensprof.profiling.table import load_profile

# ------------------------------------------------------------------ the profiler's reads


def test_all_reads_quantize_incomplete_groups():
    """Streaming: a 128-token key group is read unquantized until complete; all: every token is read quantized."""
    s = get_scheme("int4_c128")
    streaming = quantized_reads(s, 64, reads="streaming")
    assert streaming is not None and not streaming.any()  # 64 tokens: no group complete, nothing read quantized
    assert quantized_reads(s, 64, reads="all") is None  # None: every read quantized
    assert first_quantized_row([(s, None)], 256) == 127 and first_quantized_row([(s, None)], 256, "all") == 0
    # sinks and residual windows are the scheme's own: both regimes keep them
    r = get_scheme("int2_c32_r32_s4")
    rows = quantized_reads(r, 100, reads="all")
    assert not rows[:, :4].any() and not rows[99, 68:].any() and rows[99, 4:68].all()


@pytest.fixture(scope="module")
def regimes(tmp_path_factory, _one_thread):
    """Layer 0 of a tiny llama profiled in both regimes on one 128-token window: one 128-token group."""
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (2, 128), generator=torch.Generator().manual_seed(1))
    out = {}
    for reads in ("streaming", "all"):
        d = tmp_path_factory.mktemp(reads) / "prof"
        out[reads] = run_profile(model, ids, parse_schemes("int4_c32,int4_c128,int4_t32"), out_dir=str(d),
                                 model_id="tiny-llama", progress=False, reads=reads,
                                 extra_meta={"window_slots": [0, 1], "text_files": None, "max_positions": 512})
    return out


def _kl(profile, tensor, scheme):
    t = profile.table
    return float(t[(t.tensor == tensor) & (t.scheme == scheme)].kl.sum())


def test_all_reads_cost_large_groups_more_at_short_windows(regimes):
    s, a = regimes["streaming"], regimes["all"]
    assert s.meta["reads"] == "streaming" and a.meta["reads"] == "all"
    assert "reads" not in s.meta["settings"] and a.meta["settings"]["reads"] == "all"
    # streaming: only the last position of the 128-token window reads the one complete group quantized
    assert 0 < _kl(s, "K", "int4_c128") < _kl(a, "K", "int4_c128")
    assert _kl(a, "K", "int4_c128") > 10 * _kl(s, "K", "int4_c128")
    # per-token values are read alike in both regimes (quantized on entry)
    assert _kl(a, "V", "int4_t32") == pytest.approx(_kl(s, "V", "int4_t32"), rel=1e-5)


def test_a_profile_resumes_only_in_its_own_regime(regimes, tmp_path):
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (2, 128), generator=torch.Generator().manual_seed(1))
    with pytest.raises(SensprofError):
        run_profile(model, ids, parse_schemes("int4_c32,int4_c128,int4_t32"), out_dir=regimes["all"].path,
                    model_id="tiny-llama", progress=False, reads="streaming")


# ------------------------------------------------------------------ pricing at the serving length


def test_scale_to_the_serving_length():
    # streaming, 256-token windows: int4_c128 moves 129 of 256 positions, int4_c32 225, per-token values all
    assert moved_share("int4_c128", "streaming", 256) == pytest.approx(129 / 256)
    assert scale("int4_c128", "streaming", 256, 4096) == pytest.approx((3969 / 4096) / (129 / 256))
    assert scale("int4_c32", "streaming", 256, 4096) == pytest.approx((4065 / 4096) / (225 / 256))
    assert scale("int4_t32", "streaming", 256, 4096) == 1.0
    assert scale("int4_c128", "all", 256, 4096) == 1.0  # every read quantized already at 256
    assert scale("int4_c128", "streaming", 256, 256) == 1.0
    assert needed_len("int4_c128", "streaming") == 128 and needed_len("int2_c32_r32_s4", "all") == 68


def _meta(reads="streaming", seq_len=256, max_positions=8192):
    return {"settings": {"seq_len": seq_len}, "reads": reads, "max_positions": max_positions}


def _table(rows):
    return pd.DataFrame([{"layer": 0, "tensor": t, "scheme": s, "kl": kl, "kl_std": 0.0, "dnll": 0.0}
                         for t, s, kl in rows])


def test_a_large_group_is_not_cheap_because_the_window_is_short():
    """Equal measured KL at 256 tokens; priced at 4096 the 128-token groups cost more than the 32-token ones."""
    table = _table([("K", "int4_c32", 1e-3), ("K", "int4_c128", 1e-3), ("V", "int4_t32", 1e-3)])
    priced, pricing = price(table, _meta(), "sensprof", None)
    kl = dict(zip(priced.scheme, priced.kl))
    assert kl["int4_c128"] > 1.5 * kl["int4_c32"] and kl["int4_t32"] == 1e-3
    assert pricing.context_len == DEFAULT_CONTEXT_LEN and pricing.reads == "streaming"
    assert set(pricing.scales) == {"int4_c32", "int4_c128"}
    assert pricing.to_json()["scales"]["int4_c128"] == pytest.approx(scale("int4_c128", "streaming", 256, 4096),
                                                                     rel=1e-5)


def _two_layers(rows):
    """Layer 0 a 512-token sliding window, layer 1 full attention; rows (tensor, scheme, kl) on both."""
    return pd.DataFrame([{"layer": i, "tensor": t, "scheme": s, "kl": kl * (i + 1), "kl_std": kl, "dnll": kl}
                         for i in (0, 1) for t, s, kl in rows])


GEMMA_LIKE = [{"index": 0, "kind": "sliding", "window": 512}, {"index": 1, "kind": "full", "window": None}]


def test_sink_schemes_on_a_slid_sliding_layer_cost_what_they_cost_without_sinks():
    """A cache past a sliding layer's window no longer sees the sink tokens, which a profile within the window always
    saw: there a sink scheme is priced as its sinkless scheme on that layer; full layers and short caches keep it."""
    assert without_sinks("int3_c32_r32_s4") == "int3_c32" and without_sinks("int4_c32_pre_r128_s4") == "int4_c32_pre"
    assert slid_layers(GEMMA_LIKE, 256, 4096) == [0]
    assert slid_layers(GEMMA_LIKE, 256, 512) == [] and slid_layers(GEMMA_LIKE, 1024, 4096) == []
    table = _two_layers([("K", "int2_c32", 1e-2), ("K", "int2_c32_r32_s4", 1e-5), ("V", "int4_t32", 1e-3)])
    meta = {**_meta(), "layers": GEMMA_LIKE}
    priced, pricing = price(table, meta, "sensprof", None)
    cell = priced.set_index(["layer", "tensor", "scheme"])
    c32 = scale("int2_c32", "streaming", 256, 4096)
    for col, base in (("kl", 1e-2), ("kl_std", 1e-2), ("dnll", 1e-2)):
        assert cell.loc[(0, "K", "int2_c32_r32_s4"), col] == pytest.approx(base * c32)  # as int2_c32 there
    r32 = scale("int2_c32_r32_s4", "streaming", 256, 4096)
    assert cell.loc[(1, "K", "int2_c32_r32_s4"), "kl"] == pytest.approx(2e-5 * r32)  # full attention: its own
    assert pricing.to_json()["sinkless"] == {"layers": [0], "schemes": {"int2_c32_r32_s4": "int2_c32"}}
    # served within the window: nothing slides, nothing changes (and the plan records no sinkless entry)
    same, within = price(table, meta, "sensprof", 512)
    assert "sinkless" not in within.to_json()
    assert same.set_index(["layer", "tensor", "scheme"]).loc[(0, "K", "int2_c32_r32_s4"), "kl"] == pytest.approx(
        1e-5 * scale("int2_c32_r32_s4", "streaming", 256, 512))
    # validate predicts the same way
    at = priced_at(table, "streaming", 256, 4096, GEMMA_LIKE).set_index(["layer", "tensor", "scheme"])
    assert at.loc[(0, "K", "int2_c32_r32_s4"), "kl"] == pytest.approx(1e-2 * c32)
    # its sinkless scheme not profiled: the sink scheme cannot be priced on the slid layer, so it is not offered
    bare, why = price(_two_layers([("K", "int2_c32_r32_s4", 1e-5), ("K", "int4_c32", 1e-3), ("V", "int4_t32", 1e-3)]),
                      meta, "sensprof", None)
    assert "int2_c32_r32_s4" not in set(bare.scheme) and why.sinkless["schemes"] == {"int2_c32_r32_s4": None}


def test_a_plan_served_past_a_window_its_profile_never_passed_says_so():
    """Gemma 3 270M's default profile (256-token windows) never fills the 512-token window of 15 of its 18 layers: a
    plan served at 1024 tokens prices those layers by extrapolation, and its plan and description say how to measure
    them instead; a profile past the window, a cache within it and a model without sliding layers say nothing."""
    note = outgrown_windows_note(GEMMA_LIKE, 256, 1024)
    assert note.startswith("the profile's 256-token windows never passed the 512-token sliding window of 1 of its 2 "
                           "layers, which 1024 tokens do")
    assert note.endswith("profile with --seq-len 1024 --windows 1 --menus long --kl sampled")
    assert outgrown_windows_note(GEMMA_LIKE, 256, 4096, "vllm").endswith("profile with --seq-len 1024")
    assert outgrown_windows_note(GEMMA_LIKE, 256, 768).endswith("--seq-len 768 --windows 1 --menus long --kl sampled")
    assert outgrown_windows_note(GEMMA_LIKE, 1024, 4096) is None and outgrown_windows_note(GEMMA_LIKE, 256, 512) is None
    assert outgrown_windows_note([{"index": 0, "kind": "full", "window": None}], 256, 4096) is None
    from sensprof.artifacts import load_plan

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    gemma = load_plan(os.path.join(root, "plans", "gemma3-270m-sensprof-4bits.json"))  # the default profile's
    assert gemma.outgrown_windows().startswith("the profile's 256-token windows never passed the 512-token sliding "
                                               "window of 15 of its 18 layers, which 4096 tokens do")
    assert f"note: {gemma.outgrown_windows()}" in gemma.describe().splitlines()
    smol = load_plan(os.path.join(root, "plans", "smollm2-135m-sensprof-5bits.json"))
    assert smol.outgrown_windows() is None and "note: " not in smol.describe()


def test_the_serving_length_is_checked():
    assert serving_context(_meta(max_positions=2048), None) == 2048  # the model's positions when fewer than 4096
    assert serving_context(_meta(max_positions=None), None) == DEFAULT_CONTEXT_LEN
    with pytest.raises(SensprofError, match=r"--context-len 9000 is beyond the model's 8192 positions; pass at most"):
        serving_context(_meta(), 9000)
    with pytest.raises(SensprofError, match=r"--context-len 100 is below the profile's 256-token windows.*--seq-len 100"):
        serving_context(_meta(), 100)


def test_a_profile_too_short_for_a_scheme_is_refused():
    table = _table([("K", "int4_c128", 1e-3), ("V", "int4_t32", 1e-3)])
    with pytest.raises(SensprofError, match=r"64-token windows are too short to price int4_c128 at 4096 tokens.*"
                                            r"--seq-len 128 or more, or without int4_c128"):
        price(table, _meta(seq_len=64), "sensprof", None)
    price(table, _meta(seq_len=64), "sensprof", None, usable={"int4_t32"})  # a scheme the target cannot use: fine


def test_a_profile_read_in_the_other_regime_is_refused():
    table = _table([("K", "int4_c32", 1e-3), ("V", "int4_t32", 1e-3)])
    with pytest.raises(SensprofError, match=r"target sensprof reads its cache streaming, but the profile read "
                                            r"int4_c32 all: re-profile with --reads streaming"):
        price(table, _meta("all"), "sensprof", None)
    # an engine's per-token dtypes are read alike in both regimes: a streaming profile prices them for vLLM
    engine = _table([("K", "fp8_e4m3", 1e-3), ("V", "fp8_e4m3", 1e-3)])
    assert price(engine, _meta(), "vllm", None)[1].reads == "all"


# ------------------------------------------------------------------ end to end


def test_plan_records_its_pricing(regimes):
    plan = make_plan(regimes["streaming"].path, "sensprof", Budget("avg_bits", 6))
    p = plan.predicted.pricing
    assert p["reads"] == "streaming" and p["profile_len"] == 128 and p["context_len"] == 512
    assert p["scales"]["int4_c128"] == pytest.approx(scale("int4_c128", "streaming", 128, 512), rel=1e-5)
    for layer in plan.layers:
        for tensor, s, dmg in (("K", layer.k_scheme, layer.k_damage), ("V", layer.v_scheme, layer.v_damage)):
            t = regimes["streaming"].table
            row = t[(t.layer == layer.layer) & (t.tensor == tensor) & (t.scheme == s)]
            if s != "none":
                assert dmg == pytest.approx(float(row.kl.iloc[0]) * p["scales"].get(s, 1.0), rel=1e-9)
    with pytest.raises(SensprofError, match="re-profile with --reads streaming"):
        make_plan(regimes["all"].path, "sensprof", Budget("avg_bits", 6))


def test_bad_reads_and_context_len_on_the_command_line(regimes, capsys, tiny_model_dir):
    prof = regimes["streaming"].path
    line = one_error_line(*run_cli(capsys, "plan", prof, "--avg-bits", "6", "--context-len", "100000"))
    assert "--context-len 100000 is beyond the model's 512 positions" in line
    line = one_error_line(*run_cli(capsys, "plan", prof, "--avg-bits", "6", "--context-len", "64"))
    assert "below the profile's 128-token windows" in line
    line = one_error_line(*run_cli(capsys, "profile", "--model", tiny_model_dir, "--target", "vllm", "--reads",
                                   "streaming", "--out", str(os.path.dirname(prof) + "-x")))
    assert "target vllm reads its cache all" in line and "--reads all" in line
    line = one_error_line(*run_cli(capsys, "profile", "--model", tiny_model_dir, "--reads", "some",
                                   "--out", str(os.path.dirname(prof) + "-y")))
    assert "--reads 'some' is not streaming or all" in line
    meta = json.load(open(os.path.join(prof, "meta.json")))
    assert meta["reads"] == "streaming"
    assert load_profile(prof).meta["max_positions"] == 512
