"""Screened profiling: the selection rule (no torch) and a screened profile against the exact one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import VOCAB, make_tiny_model

from sensprof.errors import SensprofError
from sensprof.profiling.profile import run_profile
from sensprof.schemes import Menu, parse_schemes
from sensprof.profiling.screen import anchors, fill_rows, fit_line, lower_hull, predict, to_measure


def test_anchors_span_the_local_error():
    local = {"a": 0.5, "b": 0.1, "c": 0.3, "d": 0.2, "e": 0.4}
    assert anchors(local) == ["b", "c", "a"]
    assert sorted(anchors({"x": 1.0, "y": 2.0})) == ["x", "y"]


def test_line_recovers_a_power_law():
    local = {s: x for s, x in zip("abcd", (0.01, 0.02, 0.05, 0.1))}
    kl = {s: 3.0 * local[s] ** 1.7 for s in "abd"}
    a, b = fit_line(local, kl)
    assert b == pytest.approx(1.7) and math.exp(a) == pytest.approx(3.0)
    assert predict(local, kl)["c"] == pytest.approx(3.0 * 0.05 ** 1.7)
    assert predict(local, kl)["a"] == kl["a"]  # a measured cell keeps its measurement


def test_lower_hull_drops_dominated_and_concave_points():
    bits = {"a": 2.0, "b": 3.0, "c": 4.0, "d": 5.0, "e": 4.5}
    damage = {"a": 1.0, "b": 0.9, "c": 0.2, "d": 0.1, "e": 0.5}  # b above the a-c chord; e dominated by c
    assert lower_hull(bits, damage) == ["a", "c", "d"]


def test_to_measure_stops_when_the_hull_is_measured():
    bits = {s: float(i) for i, s in enumerate("abcdefg", start=2)}
    local = {s: 0.5 / (i + 1) ** 2 for i, s in enumerate("abcdefg")}
    truth = {s: 2.0 * local[s] ** 2 for s in local}
    kl: dict = {}
    rounds = 0
    while names := to_measure(bits, local, kl):
        assert not set(names) & set(kl)
        kl.update({s: truth[s] for s in names})
        rounds += 1
    assert rounds >= 2 and set(lower_hull(bits, predict(local, kl))) <= set(kl)


def test_fill_rows_predicts_only_unmeasured():
    rows = [{"scheme": s, "out_rel_l2": x, "kl": k, "kl_std": k / 2, "dnll": k * 3, "measured": m}
            for s, x, k, m in (("a", 0.1, 0.01, True), ("b", 0.2, 0.04, True), ("c", 0.4, float("nan"), False))]
    fill_rows(rows)
    assert rows[0]["kl"] == 0.01 and rows[2]["kl"] == pytest.approx(0.16)
    assert rows[2]["kl_std"] == pytest.approx(0.08) and rows[2]["dnll"] == pytest.approx(0.48)


K = "int2_c128,int2_c32,int3_c128,int3_c32,int4_c128,int4_c32,int6_c32,int8_c32,fp8_e4m3_cal"
V = "int2_t64,int2_t32,int3_t64,int4_t64,int4_t32,int6_t32,int8_t32,fp8_e4m3_cal"


@pytest.fixture(scope="module")
def exact_and_screened():
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    menu = Menu(tuple(parse_schemes(K)), tuple(parse_schemes(V)))
    exact = run_profile(model, ids, menu, progress=False)
    screened = run_profile(model, ids, menu, screen=True, progress=False)
    return exact.table, screened


def test_screened_measured_cells_equal_the_exact_profile(exact_and_screened):
    exact, screened = exact_and_screened
    t = screened.table
    keys = ["layer", "tensor", "scheme"]
    assert screened.meta["screen"] is True and screened.meta["settings"]["screen"] is True
    merged = exact.merge(t, on=keys, suffixes=("", "_s"))
    assert len(merged) == len(exact) == len(t) and exact.measured.all()
    # local metrics are computed for every cell, identically
    np.testing.assert_allclose(merged.out_rel_l2_s, merged.out_rel_l2, rtol=1e-6)
    m = merged[merged.measured_s]
    np.testing.assert_allclose(m.kl_s, m.kl, rtol=1e-6, atol=1e-12)
    assert 0 < (~merged.measured_s).sum() < len(merged)  # some cells skipped, not all
    assert merged.kl_s.notna().all() and (merged.kl_s >= 0).all()


def test_every_hull_cell_of_the_screened_table_was_measured(exact_and_screened):
    _, screened = exact_and_screened
    for (_, _), g in screened.table.groupby(["layer", "tensor"]):
        hull = lower_hull(dict(zip(g.scheme, g.bits)), dict(zip(g.scheme, g.kl)))
        assert set(hull) <= set(g.scheme[g.measured])


def test_screen_needs_the_replay():
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(SensprofError, match="--screen"):
        run_profile(model, ids, parse_schemes("int4_c32"), screen=True, replay=False, kl="materialized",
                    progress=False)


def test_summary_says_the_profile_was_screened(exact_and_screened):
    from sensprof.summary import summarize

    _, screened = exact_and_screened
    assert "screened (--screen)" in summarize(screened)


def test_cli_screen_writes_a_screened_profile_and_resumes(tiny_model_dir, tmp_path, capsys):
    from sensprof.cli import main
    from sensprof.profiling.table import load_profile

    out = tmp_path / "p"
    argv = ["profile", "--model", tiny_model_dir, "--device", "cpu", "--seq-len", "32", "--windows", "2",
            "--k-schemes", K, "--v-schemes", V, "--screen", "--quiet", "--out", str(out)]
    assert main(argv + ["--layers", "0"]) == 0
    assert main(argv) == 0  # resumes the other layers with the same settings
    prof = load_profile(str(out), require_complete=True)
    assert prof.meta["screen"] and not prof.table.measured.all() and prof.table.kl.notna().all()
    assert main(argv[:-4] + ["--quiet", "--out", str(out)]) == 2  # without --screen: other settings
    assert "screen" in capsys.readouterr().err


def test_cli_screen_with_naive_is_one_error(tiny_model_dir, tmp_path, capsys):
    from sensprof.cli import main

    rc = main(["profile", "--model", tiny_model_dir, "--schemes", "fp8_e4m3", "--screen", "--naive",
               "--out", str(tmp_path / "p"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--screen" in err and "Traceback" not in err


def test_a_table_written_before_screening_loads_as_measured(tmp_path, exact_and_screened):
    import shutil

    from sensprof.files import write_json

    from sensprof.profiling.table import TABLE, load_profile

    _, screened = exact_and_screened
    d = tmp_path / "old"
    d.mkdir()
    screened.table.drop(columns="measured").to_csv(d / TABLE, index=False)
    screened.heads.to_csv(d / "heads.csv", index=False)
    screened.stats.to_csv(d / "stats.csv", index=False)
    write_json(str(d / "meta.json"), screened.meta)
    write_json(str(d / "calibration.json"), screened.calibration)
    prof = load_profile(str(d))
    assert prof.table.measured.all() and list(prof.table.columns)[-1] == "measured"
    shutil.rmtree(d)
