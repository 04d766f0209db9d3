"""Which profile a model gets when the user names none of its settings (sensprof.profiling.route)."""

from __future__ import annotations

import pytest
from conftest import make_tiny_model, tiny_config

from sensprof.profiling.route import LONGEST_ROUTE, ProfileRoute, profile_route

SHORT = ProfileRoute(256, 2, None, "exact", False)


@pytest.mark.parametrize("windows, max_positions, named, expected", [
    ([512], 32768, {}, ProfileRoute(1024, 1, "long", "sampled", True)),  # Gemma 3 270M
    ([256, 512], 32768, {}, ProfileRoute(1024, 1, "long", "sampled", True)),  # the widest window decides
    ([LONGEST_ROUTE // 2], 32768, {}, ProfileRoute(LONGEST_ROUTE, 1, "long", "sampled", True)),
    ([], 8192, {}, SHORT),  # full attention: two short windows see everything a layer sees
    ([128], 8192, {}, SHORT),  # the short windows pass it
    ([4096], 32768, {}, SHORT),  # a route longer than measured: the note only
    ([512], 768, {}, SHORT),  # the model cannot hold twice its window
    ([512], 32768, {"seq_len": "512"}, ProfileRoute("512", 2, None, "exact", False)),
    ([512], 32768, {"windows": 3}, ProfileRoute(256, 3, None, "exact", False)),
    ([512], 32768, {"kl": "exact"}, SHORT),
    ([512], 32768, {"menus": "default"}, ProfileRoute(256, 2, "default", "exact", False)),
    ([512], 32768, {"named_schemes": True}, SHORT),
    ([512], 32768, {"naive": True}, SHORT),
    ([512], 32768, {"reads": "all"}, SHORT),  # an engine's regime reads sinks quantized
    ([512], 32768, {"target": "vllm"}, SHORT),  # an engine's menu is its dtypes
    ([512], 32768, {"target": "sensprof"}, ProfileRoute(1024, 1, "long", "sampled", True)),
])
def test_the_long_route_is_the_default_only_where_nothing_is_named_and_short_windows_miss_the_window(
        windows, max_positions, named, expected):
    assert profile_route(windows, max_positions, 262144, **named) == expected


def test_the_long_route_measures_kl_exactly_where_the_vocabulary_is_too_small_to_sample():
    assert profile_route([512], 32768, 512).kl == "exact"  # sampled:256 would take every token
    assert profile_route([512], 32768, 513).kl == "sampled"


def test_a_model_with_wide_sliding_windows_is_profiled_past_them_by_default(tiny_tokenizer, tmp_path, capsys):
    """A tiny Gemma 3 whose 256-token sliding windows the default windows never pass: one 512-token window of the
    long menu with sampled KL, said on stderr with the flag that gets the short profile back."""
    from sensprof import api
    from sensprof.schemes import LONG_K_SCHEMES, LONG_V_SCHEMES

    import torch

    cfg, cls = tiny_config("gemma3")
    cfg.sliding_window = 256
    torch.manual_seed(0)
    gemma = cls(cfg).eval()
    gemma.set_attn_implementation("eager")
    prof = api.profile(gemma, tokenizer=tiny_tokenizer, device="cpu", layers="0", out_dir=str(tmp_path / "p"))
    settings = prof.meta["settings"]
    assert (settings["seq_len"], settings["windows"]) == (512, 1)
    assert settings["kl"] == "exact"  # a 320-token vocabulary: nothing to sample
    assert settings["k_schemes"] == list(LONG_K_SCHEMES) and settings["v_schemes"] == list(LONG_V_SCHEMES)
    notes = [line for line in capsys.readouterr().err.splitlines() if "long-context route" in line]
    assert notes == ["sensprof: the default 256-token windows never pass this model's 256-token sliding window, so "
                     "it gets the long-context route: --seq-len 512 --windows 1 --menus long --kl exact "
                     "(docs/plan-quality.md); name --seq-len 256 for the short profile"]
    short = api.profile(make_tiny_model("gemma3"), tokenizer=tiny_tokenizer, device="cpu", layers="0",
                        schemes="fp8_e4m3", progress=False)  # sliding window 8: the short windows pass it
    assert (short.meta["settings"]["seq_len"], short.meta["settings"]["windows"]) == (256, 2)
