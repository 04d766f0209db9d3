"""`sensprof merge` of whole profiles on other windows of the same text: one profile of all their windows."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from sensprof import api
from sensprof.data import select_windows
from sensprof.errors import SensprofError
from sensprof.models import load_model
from sensprof.profiling.profile import run_profile
from sensprof.profiling.table import load_profile, merge_profiles
from sensprof.schemes import parse_schemes

SCHEMES = "int4_c32,int2_t32,int4_t32_r16"
RUN = dict(schemes=SCHEMES, seq_len=32, progress=False)


@pytest.fixture(scope="module")
def one_window_profiles(tmp_path_factory, tiny_model_dir):
    """Two one-window profiles of the tiny Llama on the built-in text, seeds 0 and 1 (other windows)."""
    root = tmp_path_factory.mktemp("windows")
    dirs = [str(root / f"seed{seed}") for seed in (0, 1)]
    for seed, d in zip((0, 1), dirs):
        api.profile(tiny_model_dir, out_dir=d, windows=1, seed=seed, **RUN)
    return dirs


def _meta(d):
    with open(os.path.join(d, "meta.json")) as f:
        return json.load(f)


def test_merged_windows_are_one_profile_of_both_windows(one_window_profiles, tiny_model_dir, tmp_path):
    a, b = one_window_profiles
    merged = str(tmp_path / "merged")
    meta = merge_profiles([a, b], merged)
    ma, mb = _meta(a), _meta(b)
    assert meta["complete"] and meta["settings"]["windows"] == 2 and meta["windows_merged"]
    assert meta["window_slots"] == ma["window_slots"] + mb["window_slots"]
    assert meta["token_count"] == ma["token_count"] + mb["token_count"]
    prof = load_profile(merged, require_complete=True)
    # the same two windows profiled in one run: the KL of every cell, its spread and dNLL agree
    loaded = load_model(tiny_model_dir)
    ids = torch.cat([select_windows(loaded.tokenizer, None, 32, 1, seed)[0] for seed in (0, 1)])
    ref = run_profile(loaded.model, ids, parse_schemes(SCHEMES), out_dir=str(tmp_path / "ref"), progress=False)
    key = ["layer", "tensor", "scheme"]
    ours, theirs = prof.table.set_index(key).sort_index(), ref.table.set_index(key).sort_index()
    assert list(ours.index) == list(theirs.index)
    for col in ("kl", "kl_std", "dnll", "attn_kl"):
        np.testing.assert_allclose(ours[col], theirs[col], rtol=1e-4, atol=1e-9, err_msg=col)
    assert (ours.kl_std > 0).all()  # two windows: a spread, where each input alone had none
    wins = prof.windows.set_index(key + ["window"]).kl
    first = load_profile(a).windows.set_index(key + ["window"]).kl
    for (layer, tensor, scheme, w), kl in first.items():  # the first input's windows come first, unchanged
        assert wins.loc[(layer, tensor, scheme, w)] == pytest.approx(kl, rel=1e-12)
    # calibration: each head's largest absmax over the windows, as the one run measured it
    for layer, by_tensor in ref.calibration.items():
        for tensor, values in by_tensor.items():
            np.testing.assert_allclose(prof.calibration[str(layer)][tensor], values, rtol=1e-5)


def test_a_plan_from_the_merged_profile_excludes_both_inputs_windows(one_window_profiles, tmp_path):
    merged = str(tmp_path / "merged")
    merge_profiles(list(one_window_profiles), merged)
    plan = api.plan(merged, avg_bits=4, select_measured=0, log=lambda *a: None)[0]
    assert sorted(plan.profile.window_slots) == sorted(s for d in one_window_profiles
                                                      for s in _meta(d)["window_slots"])


def test_the_same_windows_twice_are_refused(one_window_profiles, tmp_path, tiny_model_dir):
    a, _ = one_window_profiles
    again = str(tmp_path / "again")
    api.profile(tiny_model_dir, out_dir=again, windows=2, seed=0, **RUN)  # seed 0 again: it holds a's window
    assert set(_meta(a)["window_slots"]) & set(_meta(again)["window_slots"])
    with pytest.raises(SensprofError, match="both read window slot .* another --seed"):
        merge_profiles([a, again], str(tmp_path / "merged"))
    assert not os.path.exists(tmp_path / "merged")


def test_partial_screened_and_other_profiles_are_refused(one_window_profiles, tmp_path, tiny_model_dir):
    a, _ = one_window_profiles
    partial = str(tmp_path / "partial")
    api.profile(tiny_model_dir, out_dir=partial, windows=1, seed=2, layers="0", **RUN)
    with pytest.raises(SensprofError, match="partial profile"):
        merge_profiles([a, partial], str(tmp_path / "m1"))
    other = str(tmp_path / "other-menu")
    api.profile(tiny_model_dir, out_dir=other, windows=1, seed=3, schemes="int4_c32", seq_len=32, progress=False)
    with pytest.raises(SensprofError, match="other settings"):
        merge_profiles([a, other], str(tmp_path / "m2"))
    screened = [str(tmp_path / f"screened{seed}") for seed in (4, 5)]
    for seed, d in zip((4, 5), screened):
        api.profile(tiny_model_dir, out_dir=d, windows=1, seed=seed, screen=True, **RUN)
    with pytest.raises(SensprofError, match="--screen"):
        merge_profiles(screened, str(tmp_path / "m3"))
    for name in ("m1", "m2", "m3"):
        assert not os.path.exists(tmp_path / name)


def test_cli_merges_windows(one_window_profiles, tmp_path, capsys):
    from sensprof.cli import main

    out = str(tmp_path / "cli")
    assert main(["merge", *one_window_profiles, "--out", out]) == 0
    assert "merged 2 profiles" in capsys.readouterr().out
    assert load_profile(out, require_complete=True).meta["settings"]["windows"] == 2
