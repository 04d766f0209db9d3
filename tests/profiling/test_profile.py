"""run_profile end to end on tiny models of every architecture."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ARCHS, VOCAB, make_tiny_model

import sensprof.profiling.profile as profile_mod
from sensprof.errors import SensprofError
from sensprof.memory import bits_per_element
from sensprof.models import describe_layers
from sensprof.profiling.profile import run_profile
from sensprof.schemes import parse_schemes
from sensprof.profiling.table import HEAD_COLUMNS, STATS_COLUMNS, TABLE_COLUMNS

SCHEMES = "int8_per_token_head,int2_t32,int4_c32,int4_c32_pre,int4_t32_r16,fp8_e4m3_cal,int2_t32_r64"
EXPECTED_KINDS = {"llama": ["full"] * 3, "mistral": ["sliding"] * 3, "qwen2": ["full"] * 3, "qwen3": ["full"] * 3,
                  "phi3": ["full"] * 3, "gemma3": ["sliding", "sliding", "full"]}
METRICS = ["kl", "kl_std", "dnll", "attn_kl", "out_rel_l2"]


def _ids():
    """The same windows as conftest's tiny_ids (module-scoped fixtures cannot use that one)."""
    return torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=ARCHS)
def arch_run(request):
    arch = request.param
    model = make_tiny_model(arch)
    schemes = parse_schemes(SCHEMES)
    prof = run_profile(model, _ids(), schemes, progress=False)
    return arch, model, schemes, prof


def _sorted(df, keys):
    return df.sort_values(keys).reset_index(drop=True)


def _assert_tables_close(a, b, rtol=1e-6, atol=1e-10):
    keys = ["layer", "tensor", "scheme"]
    a, b = _sorted(a.table, keys), _sorted(b.table, keys)
    assert a[keys + ["layer_kind", "bits"]].equals(b[keys + ["layer_kind", "bits"]])
    np.testing.assert_allclose(a[METRICS].to_numpy(), b[METRICS].to_numpy(), rtol=rtol, atol=atol)


def _assert_heads_close(a, b, rtol=1e-6, atol=1e-10):
    keys = ["layer", "tensor", "scheme", "head"]
    a, b = _sorted(a.heads, keys), _sorted(b.heads, keys)
    assert a[keys].equals(b[keys])
    np.testing.assert_allclose(a[["attn_kl", "out_rel_l2"]].to_numpy(), b[["attn_kl", "out_rel_l2"]].to_numpy(),
                               rtol=rtol, atol=atol)


# ---------------------------------------------------------------- the table of every architecture


def test_table_has_one_row_per_cell(arch_run):
    arch, model, schemes, prof = arch_run
    infos = describe_layers(model)
    t = prof.table
    assert isinstance(t, pd.DataFrame) and list(t.columns) == TABLE_COLUMNS
    expected = {(i, "K", s.name) for i in range(len(infos)) for s in schemes}
    expected |= {(i, "V", s.name) for i in range(len(infos)) for s in schemes if not s.pre_rope}
    got = list(zip(t.layer, t.tensor, t.scheme))
    assert len(got) == len(set(got)) == len(expected) == 3 * 13
    assert set(got) == expected
    for row in t.itertuples():
        assert row.bits == pytest.approx(bits_per_element(parse_schemes(row.scheme)[0], infos[row.layer].head_dim))


def test_metrics_are_finite_and_sane(arch_run):
    arch, model, schemes, prof = arch_run
    t = prof.table
    for col in METRICS:
        assert np.isfinite(t[col].to_numpy()).all(), col
    for col in ("kl", "kl_std", "attn_kl", "out_rel_l2"):
        assert (t[col] >= 0).all(), col
    v, k = t[t.tensor == "V"], t[t.tensor == "K"]
    assert (v.attn_kl == 0).all()  # quantizing V leaves the attention weights alone
    # quantizing K at 2 bits moves the attention weights of every layer
    assert (k[k.scheme == "int2_t32"].attn_kl > 0).all()
    assert (t[t.scheme == "int2_t32"].out_rel_l2 > 1e-3).all()
    assert (t[t.scheme == "int2_t32"].kl > 0).all()
    # a residual as long as the window keeps every read in full precision: (next to) no damage
    assert (t[t.scheme == "int2_t32_r64"].kl < 1e-9).all()
    assert (t[t.scheme == "int2_t32_r64"].out_rel_l2 < 1e-5).all()


def test_stronger_quantization_costs_more(arch_run):
    arch, model, schemes, prof = arch_run
    t = prof.table

    def total(col, scheme, tensors=("K", "V")):
        return t[(t.scheme == scheme) & t.tensor.isin(tensors)][col].sum()

    # end to end, summed over layers
    for tensors in (("K",), ("V",), ("K", "V")):
        strong, weak = total("kl", "int2_t32", tensors), total("kl", "int8_per_token_head", tensors)
        assert strong > 10 * weak > 0, (tensors, strong, weak)
    # locally (computed in float64), for K as well
    for col, tensors in (("out_rel_l2", ("K",)), ("out_rel_l2", ("V",)), ("attn_kl", ("K",))):
        strong, weak = total(col, "int2_t32", tensors), total(col, "int8_per_token_head", tensors)
        assert strong > 10 * weak > 0, (col, tensors, strong, weak)


def test_kl_ranks_k_schemes_on_llama(tiny_ids):
    model = make_tiny_model("llama")
    t = run_profile(model, tiny_ids, parse_schemes("int8_per_token_head,int2_t32"), progress=False).table
    k = t[t.tensor == "K"]
    strong, weak = k[k.scheme == "int2_t32"].kl.sum(), k[k.scheme == "int8_per_token_head"].kl.sum()
    assert strong > 10 * weak  # the true (float64) ratio of these logits is in the thousands


def test_layer_kinds_recorded(arch_run):
    arch, model, schemes, prof = arch_run
    kinds = EXPECTED_KINDS[arch]
    assert [layer["kind"] for layer in prof.meta["layers"]] == kinds
    for row in prof.table.itertuples():
        assert row.layer_kind == kinds[row.layer]
    stats = prof.stats
    assert list(stats.columns) == STATS_COLUMNS
    assert sorted(zip(stats.layer, stats.tensor)) == sorted((i, n) for i in range(3) for n in ("K_pre", "K", "V"))
    for row in stats.itertuples():
        assert row.layer_kind == kinds[row.layer]
        assert row.absmax > 0 and row.outlier_ratio >= 1.0 and math.isfinite(row.kurtosis)
    windows = [layer["window"] for layer in prof.meta["layers"]]
    if arch == "mistral":
        assert windows == [16, 16, 16]
    if arch == "gemma3":
        assert windows == [8, 8, None]


def test_heads_table_matches_layer_table(arch_run):
    arch, model, schemes, prof = arch_run
    h = prof.heads
    assert list(h.columns) == HEAD_COLUMNS
    assert len(h) == len(prof.table) * 4  # 4 query heads
    mean = h.groupby(["layer", "tensor", "scheme"])[["attn_kl", "out_rel_l2"]].mean()
    t = prof.table.set_index(["layer", "tensor", "scheme"]).loc[mean.index]
    np.testing.assert_allclose(mean.to_numpy(), t[["attn_kl", "out_rel_l2"]].to_numpy(), rtol=1e-9, atol=1e-15)


def test_replay_equals_naive_forward(arch_run, monkeypatch):
    arch, model, schemes, prof = arch_run
    replays = []
    real = profile_mod.replay_from

    def counting(*a, **k):
        replays.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(profile_mod, "replay_from", counting)
    naive = run_profile(model, _ids(), schemes, replay=False, progress=False)
    assert replays == []  # the naive run really ran every layer
    assert naive.meta["replay"] is False and prof.meta["replay"] is True
    _assert_tables_close(prof, naive)
    _assert_heads_close(prof, naive)


def test_variants_per_pass_equals_one_at_a_time(arch_run):
    arch, model, schemes, prof = arch_run
    batched = run_profile(model, _ids(), schemes, variants_per_pass=3, progress=False)
    assert batched.meta["settings"]["variants_per_pass"] == 3
    _assert_tables_close(prof, batched, rtol=1e-5, atol=1e-9)
    _assert_heads_close(prof, batched, rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------- inputs and options


def test_nan_baseline_is_refused(tiny_ids):
    model = make_tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(SensprofError, match="NaN"):
        run_profile(model, tiny_ids, parse_schemes("int4_t32"), progress=False)
    # the failed run left the model as it was
    assert model.config._attn_implementation == "eager"


def test_layer_subset(tiny_ids, monkeypatch):
    model = make_tiny_model("qwen3")
    schemes = parse_schemes("int2_t32,int4_c32_pre")
    ran = []
    real = profile_mod.profile_layer

    def spy(model_, session, layer, *a, **k):
        ran.append(layer)
        return real(model_, session, layer, *a, **k)

    monkeypatch.setattr(profile_mod, "profile_layer", spy)
    sub = run_profile(model, tiny_ids, schemes, layers=[1], progress=False)
    monkeypatch.undo()
    assert ran == [1]
    assert set(sub.table.layer) == {1} and set(sub.heads.layer) == {1}
    assert len(sub.table) == 3  # K: 2 schemes, V: 1
    assert sub.meta["layers_done"] == [1] and sub.meta["complete"] is False
    assert sorted(set(sub.stats.layer)) == [0, 1, 2]  # the baseline pass sees every layer
    full = run_profile(model, tiny_ids, schemes, progress=False)
    assert full.meta["complete"] is True
    full_rows = full.table[full.table.layer == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(sub.table.reset_index(drop=True), full_rows, check_exact=False, rtol=1e-9)


@pytest.mark.parametrize("kwargs,match", [({"layers": [3]}, "out of range"), ({"layers": [-1]}, "out of range"),
                                          ({"variants_per_pass": 0}, "at least 1")])
def test_bad_options_are_refused(tiny_ids, kwargs, match):
    model = make_tiny_model("llama")
    with pytest.raises(SensprofError, match=match):
        run_profile(model, tiny_ids, parse_schemes("int4_t32"), progress=False, **kwargs)


def test_python_api_profile(tiny_tokenizer, tmp_path):
    from sensprof import api

    model = make_tiny_model("llama")
    prof = api.profile(model, schemes=["int4_t32", "int2_c32_pre"], tokenizer=tiny_tokenizer, seq_len=32,
                       windows=2, progress=False)
    assert isinstance(prof.table, pd.DataFrame) and isinstance(prof.heads, pd.DataFrame)
    assert isinstance(prof.stats, pd.DataFrame)
    assert list(prof.table.columns) == TABLE_COLUMNS
    assert len(prof.table) == 3 * 3  # per layer: K 2 schemes, V 1
    assert set(prof.table.scheme) == {"int4_t32", "int2_c32_pre"}
    assert prof.meta["settings"]["seq_len"] == 32 and prof.meta["settings"]["windows"] == 2
    assert prof.meta["token_count"] == 64
    assert (prof.table.kl > 0).all()
    # the same call with an out_dir writes the artifact and returns the same table
    out = tmp_path / "api"
    saved = api.profile(model, schemes="int4_t32,int2_c32_pre", tokenizer=tiny_tokenizer, seq_len=32, windows=2,
                        progress=False, out_dir=str(out))
    assert saved.path == str(out) and (out / "profile.csv").is_file()
    pd.testing.assert_frame_equal(saved.table, prof.table, check_exact=False, rtol=1e-12)
    with pytest.raises(SensprofError, match="tokenizer"):
        api.profile(model, schemes="int4_t32", seq_len=32, windows=2, progress=False)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3"])
def test_long_windows_attend_a_block_of_queries_at_a_time(monkeypatch, arch):
    """Blocks of queries (so that long windows never hold [T, T] weights for every query) give the same table."""
    import sensprof.profiling.hooks as hooks

    model = make_tiny_model(arch)
    schemes = parse_schemes("int2_t32,int4_c32_pre_r8,int8_per_token_head" if arch == "qwen3" else "int2_t32,int4_c32_s4")
    whole = run_profile(model, _ids(), schemes, progress=False).table
    monkeypatch.setattr(hooks, "QUERY_BLOCK", 24)  # 64 tokens: blocks of 24, 24 and 16 queries
    blocked = run_profile(model, _ids(), schemes, progress=False).table
    for col in ("kl", "dnll", "attn_kl", "out_rel_l2"):
        np.testing.assert_allclose(blocked[col], whole[col], rtol=1e-5, atol=1e-12, err_msg=col)


def test_kv_absmax_is_the_calibration_the_profile_records(arch_run):
    """The checks that calibrate on windows of their own (the engine tests) use what a profile would record."""
    from sensprof.profiling.profile import kv_absmax

    _, model, _, prof = arch_run
    mine = kv_absmax(model, _ids())
    assert len(mine) == len(prof.calibration) and {"K", "V"} <= set(mine[0])
    for i, by_tensor in enumerate(mine):
        assert by_tensor == prof.calibration[str(i)]
        assert all(x > 0 for values in by_tensor.values() for x in values)


def test_long_menus_profile_only_the_layouts_that_win_at_length(tiny_tokenizer, tmp_path, capsys):
    """`profile --menus long`: the sink-and-residual 64-token layouts (and 32-token keys at 2-3 bits) on both
    tensors, and keys without them, planned like any profile; refused where a sliding-window layer would outgrow
    the sinks the profile measured, and beside an engine target."""
    from conftest import one_error_line, run_cli

    from sensprof import api
    from sensprof.cli import main
    from sensprof.schemes import LONG_K_SCHEMES, LONG_V_SCHEMES

    gemma = make_tiny_model("gemma3")  # sliding window 8
    prof = api.profile(gemma, tokenizer=tiny_tokenizer, menus="long", seq_len=128, windows=1, device="cpu",
                       progress=False, out_dir=str(tmp_path / "p"))
    t = prof.table
    assert set(t[t.tensor == "K"].scheme) == set(LONG_K_SCHEMES)
    assert set(t[t.tensor == "V"].scheme) == set(LONG_V_SCHEMES)
    assert len(t) == 3 * (len(LONG_K_SCHEMES) + len(LONG_V_SCHEMES))
    assert {s for s in t[t.tensor == "V"].scheme if not s.endswith("_r32_s4")} == {"int2_t64", "int3_t64", "int4_t64"}
    after_rope = {s for s in t[t.tensor == "K"].scheme if "_pre" not in s}
    plain = {s for s in after_rope if not s.endswith("_r32_s4")}
    assert plain == {"int2_c64", "int3_c64", "int4_c64", "int5_c64", "int6_c64", "int8_c64", "int3_c128", "int4_c128"}
    before_rope = {s for s in t[t.tensor == "K"].scheme if "_pre" in s}  # every key also before RoPE (KVQuant's)
    assert {s.replace("_pre", "") for s in before_rope} == after_rope and len(before_rope) == len(after_rope)
    assert prof.meta["settings"]["k_schemes"] == list(LONG_K_SCHEMES)
    assert main(["plan", str(tmp_path / "p"), "--avg-bits", "5", "--select-measured", "0", "--out",
                 str(tmp_path / "plan.json")]) == 0
    outgrown = r"sliding-window layer of 8 tokens .* pass --seq-len above 8 \(e.g. 1024\)"
    with pytest.raises(SensprofError, match=outgrown):
        api.profile(gemma, tokenizer=tiny_tokenizer, menus="long", seq_len=8, windows=1, device="cpu", progress=False)
    line = one_error_line(*run_cli(capsys, "profile", "--menus", "long", "--target", "vllm"))
    assert "--menus chooses sensprof's own menus; target vllm profiles its engine's types" in line
    line = one_error_line(*run_cli(capsys, "profile", "--menus", "short"))
    assert "--menus" in line and "'long'" in line


def test_a_profile_that_never_passes_a_sliding_window_says_how_to_measure_past_it(tiny_tokenizer, capsys):
    """Before profiling: windows no longer than a sliding window leave that layer's damage past it to extrapolation,
    which misranked Gemma 3 270M's layers at 1024 tokens; the note names the profile that measures it."""
    from sensprof import api

    gemma = make_tiny_model("gemma3")  # sliding window 8
    for seq_len, target in ((8, None), (16, None), (8, "vllm")):
        api.profile(gemma, tokenizer=tiny_tokenizer, schemes="fp8_e4m3", seq_len=seq_len, windows=1, device="cpu",
                    target=target, layers="0")
        err = capsys.readouterr().err
        note = [line for line in err.splitlines() if line.startswith("sensprof: note: ")]
        if seq_len > 8:
            assert not note
        elif target is None:
            assert note == ["sensprof: note: 8-token windows do not pass this model's 8-token sliding window, so plans "
                            "served past 8 tokens price those layers by extrapolation; for them profile with --seq-len "
                            "16 --windows 1 --menus long --kl sampled"]
        else:
            assert len(note) == 1 and note[0].endswith("profile with --seq-len 16")
    api.profile(make_tiny_model("llama"), tokenizer=tiny_tokenizer, schemes="fp8_e4m3", seq_len=8, windows=1,
                device="cpu", layers="0")
    assert "note: " not in capsys.readouterr().err
