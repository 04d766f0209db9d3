"""The default per-tensor menus end to end on a tiny model: sweep against every uniform configuration of the menu,
the robust objective, `plan --refine`, and profiles at several lengths."""

from __future__ import annotations

import json
import math
import os
import types

import pandas as pd
import pytest

from sensprof.schemes import get_scheme
from conftest import one_error_line, run_cli

from sensprof.cli import main
from sensprof.errors import SensprofError
from sensprof.planning.uniforms import before_rope
from sensprof.schemes import DEFAULT_K_SCHEMES, DEFAULT_V_SCHEMES
from sensprof.profiling.table import load_profile


@pytest.fixture(scope="module")
def menu_run(tiny_model_dir, tmp_path_factory, _one_thread):
    root = tmp_path_factory.mktemp("menu")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--seq-len", "64,128", "--windows", "2", "--out", str(prof),
                 "--device", "cpu", "--quiet"]) == 0
    sweep = root / "sweep"
    assert main(["sweep", str(prof), "--validate", "--device", "cpu", "--avg-bits", "3,4,5,6",
                 "--out", str(sweep)]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), sweep=str(sweep), model=tiny_model_dir)


def test_default_menus_are_profiled_per_tensor(menu_run):
    prof = load_profile(menu_run.profile)
    t = prof.table
    assert set(t[t.tensor == "K"].scheme) == set(DEFAULT_K_SCHEMES)
    assert set(t[t.tensor == "V"].scheme) == set(DEFAULT_V_SCHEMES)
    assert len(t) == 3 * (len(DEFAULT_K_SCHEMES) + len(DEFAULT_V_SCHEMES))
    assert prof.meta["settings"]["k_schemes"] == list(DEFAULT_K_SCHEMES)
    sixty_four = {s for s in DEFAULT_K_SCHEMES if "_c64" in s}  # every 64-token key group also before RoPE
    assert {before_rope(s) for s in sixty_four} == {s for s in sixty_four if "_pre" in s} != set()
    assert prof.meta["memory"]["peak_rss_gib"] > 0 and prof.meta["cost_s"]["layers"] > 0


def test_several_lengths(menu_run, capsys):
    prof = load_profile(menu_run.profile)
    # 128 tokens: the default menu's 128-token key groups need one whole group to be priced (sensprof.planning.pricing)
    assert prof.meta["settings"]["seq_len"] == 128 and prof.meta["lengths"] == [64, 128]
    short = load_profile(os.path.join(menu_run.profile, "lengths", "64"))
    assert short.meta["settings"]["seq_len"] == 64 and len(short.table) == len(prof.table)
    rc, out, err = run_cli(capsys, "summary", menu_run.profile)
    assert rc == 0, err
    assert "damage vs context length" in out and "the planner uses the longest, 128" in out
    row = next(line for line in out.splitlines() if line.startswith("K      int2_c32 "))
    k = short.table[(short.table.tensor == "K") & (short.table.scheme == "int2_c32")].kl.sum()
    assert f"{k:.2e}" in row


def test_sweep_measures_the_menus_uniform_configurations(menu_run):
    df = pd.read_csv(os.path.join(menu_run.sweep, "sweep.csv"))
    uniform = pd.read_csv(os.path.join(menu_run.sweep, "uniform.csv"))
    assert (uniform.measured_kl > 0).all() and len(uniform) >= 4
    assert any(" / " in c for c in uniform.config)  # K and V from the per-tensor menus
    assert "uniform KIVI-4 (int4_c32 / int4_t32)" in set(uniform.config)
    for r in df.itertuples():
        for tag, pool in (("le", uniform[uniform.avg_bits <= r.avg_bits + 1e-9]),
                          ("ge", uniform[(uniform.avg_bits >= r.avg_bits - 1e-9) & (uniform.avg_bits <= r.avg_bits + 0.5 + 1e-9)])):
            if not len(pool):
                assert math.isnan(getattr(r, f"best_uniform_{tag}_kl"))
                continue
            best = pool.loc[pool.measured_kl.idxmin()]
            assert getattr(r, f"best_uniform_{tag}") == best.config
            assert getattr(r, f"best_uniform_{tag}_kl") == pytest.approx(best.measured_kl)
            assert getattr(r, f"kl_vs_uniform_{tag}") == pytest.approx(r.measured_kl / best.measured_kl)
        assert r.validation_tokens == "2x128"
        # memory as a 128-token cache holds it: full-precision sink, residual and incomplete-group tokens count
        at_len = uniform[uniform.avg_bits_at_len <= r.avg_bits_at_len + 1e-9]
        if len(at_len):
            assert r.best_uniform_le_at_len == at_len.loc[at_len.measured_kl.idxmin()].config
    assert df.best_uniform_le.notna().any() and df.best_uniform_ge.notna().any()
    assert (df.avg_bits_at_len >= df.avg_bits - 1e-9).all() and (uniform.avg_bits_at_len >= uniform.avg_bits - 1e-9).all()
    kivi = uniform.set_index("config").loc["uniform KIVI-4 (int4_c32 / int4_t32)"]
    # keys: 128 tokens = 4 whole groups of 32 (nothing waits); values: quantized on entry
    assert kivi.avg_bits_at_len == pytest.approx(kivi.avg_bits)


def test_bits_held_at_a_length():
    from sensprof.memory import bits_per_element
    from sensprof.report.data import config_bits_at

    meta = {"layers": [{"index": 0, "kv_heads": 2, "head_dim": 64}, {"index": 1, "kv_heads": 2, "head_dim": 64}]}
    pairs = [("int2_c32_r32_s4", "int4_t32"), ("none", "int4_t32")]
    k = bits_per_element(get_scheme("int2_c32_r32_s4"), 64)
    v = bits_per_element(get_scheme("int4_t32"), 64)
    # 1024 tokens: 4 sinks, the 32 most recent and the 28 of an incomplete group at 16 bits; 30 groups of 32 quantized
    assert config_bits_at(meta, pairs, 1024) == pytest.approx(((960 * k + 64 * 16) / 1024 + v + 16 + v) / 4)
    assert config_bits_at(meta, pairs, 1 << 20) == pytest.approx((k + v + 16 + v) / 4, rel=1e-3)
    # a sliding-window layer holds its window (as Budget(context_len=...) prices it): 64 tokens, 2 whole groups,
    # and weighs 64 tokens' worth against the full layer's 1000 in the average per element held
    meta["layers"][0].update(kind="sliding", window=64)
    kivi = [("int4_c32", "int4_t32"), ("none", "none")]
    k4 = bits_per_element(get_scheme("int4_c32"), 64)
    assert config_bits_at(meta, kivi, 1000) == pytest.approx((64 * (k4 + v) + 1000 * 32) / (2 * (64 + 1000)))
    k1000 = (992 * k4 + 8 * 16) / 1000  # 31 whole groups of 32, 8 tokens waiting at 16 bits
    assert config_bits_at(meta, kivi[::-1], 1000) == pytest.approx((64 * 32 + 1000 * (k1000 + v)) / (2 * (64 + 1000)))


def test_sweep_every_uniform_and_report(menu_run, tmp_path):
    out = tmp_path / "all"
    assert main(["sweep", menu_run.profile, "--validate", "--device", "cpu", "--avg-bits", "4",
                 "--uniform", "all", "--seq-len", "48", "--out", str(out)]) == 0
    uniform = pd.read_csv(out / "uniform.csv")
    assert len(uniform) >= len(DEFAULT_K_SCHEMES) * len(DEFAULT_V_SCHEMES)
    assert pd.read_csv(out / "sweep.csv").validation_tokens.iloc[0] == "2x48"
    rep = tmp_path / "report"
    assert main(["report", menu_run.profile, "--sweep", str(out), "--out", str(rep)]) == 0
    html = (rep / "report.html").read_text()
    assert "Keys vs values per layer at int" in html and " / int" in html  # a K and a V layout of equal bits
    assert "Damage vs context length" in html and (rep / "damage_by_length.png").stat().st_size > 1000
    from sensprof.report import data

    prof = load_profile(menu_run.profile)
    points = data.sweep_points(str(out), prof.table, prof.meta)
    held = data.held_at_validation_length([("sensprof", points)], data.uniform_configs(prof.table, prof.meta),
                                          uniform, prof.meta)
    assert held is not None and held[3] == 48  # the frontier's memory axis: what a 48-token cache holds
    [(_, plans_at)], uniform_at, measured_at, _ = held
    assert list(plans_at.avg_bits) == list(points.avg_bits_at_len)
    assert list(measured_at.avg_bits) == list(uniform.avg_bits_at_len)
    assert (uniform_at.avg_bits >= data.uniform_configs(prof.table, prof.meta).set_index("config").loc[
        uniform_at.config].avg_bits.to_numpy() - 1e-9).all()
    assert data.held_at_validation_length([("x", points.assign(validation_tokens="2x48"))], uniform_at,
                                          uniform.drop(columns="avg_bits_at_len"), prof.meta) is None

    by_len = data.damage_by_length(load_profile(menu_run.profile))
    assert sorted(set(by_len.seq_len)) == [64, 128]
    short = load_profile(os.path.join(menu_run.profile, "lengths", "64")).table
    got = by_len[(by_len.seq_len == 64) & (by_len.tensor == "V") & (by_len.scheme == "int4_t32")].kl_sum.iloc[0]
    assert got == pytest.approx(short[(short.tensor == "V") & (short.scheme == "int4_t32")].kl.sum())


def test_sweep_at_a_context_length(menu_run, tmp_path):
    out = tmp_path / "at192"
    assert main(["sweep", menu_run.profile, "--avg-bits", "6,8", "--context-len", "192", "--out", str(out)]) == 0
    df = pd.read_csv(out / "sweep.csv")
    assert list(df.context_len) == [192, 192]
    for r in df.itertuples():
        plan = json.loads(open(r.plan).read())
        assert plan["budget"]["context_len"] == 192
        assert plan["predicted"]["avg_bits_at_context"] <= r.budget_avg_bits + 1e-9


def test_sweep_selects_each_budgets_plan_by_measurement_as_plan_does(menu_run, tmp_path, capsys):
    """sweep --select-measured N writes, at each budget, the plan `plan --select-measured N` writes there (the model
    loaded once, its windows the same), and --validate then measures them."""
    out = tmp_path / "selected"
    rc, stdout, err = run_cli(capsys, "sweep", menu_run.profile, "--avg-bits", "3,6", "--select-measured", "1",
                              "--select-seq-len", "96", "--validate", "--device", "cpu", "--uniform", "none",
                              "--out", str(out))
    assert rc == 0, err
    assert stdout.count("select: measuring") == 2
    df = pd.read_csv(out / "sweep.csv")
    assert list(df.budget_avg_bits) == [3, 6] and df.selected.notna().all()
    for r in df.itertuples():
        swept = json.loads(open(r.plan).read())
        select = swept["solver"]["select"]
        assert select["windows"] == 1 and select["seq_len"] == 96 and select["chosen"] == r.selected
        alone = tmp_path / f"plan-{r.budget_avg_bits:g}.json"
        rc, _, err = run_cli(capsys, "plan", menu_run.profile, "--avg-bits", f"{r.budget_avg_bits:g}",
                             "--select-measured", "1", "--select-seq-len", "96", "--device", "cpu", "--out", str(alone))
        assert rc == 0, err
        planned = json.loads(alone.read_text())
        assert planned["layers"] == swept["layers"] and planned["solver"]["select"] == select
        assert r.validation_tokens == "2x128"
    plain = pd.read_csv(os.path.join(menu_run.sweep, "sweep.csv"))
    assert "selected" not in plain  # without --select-measured: the planner's plans, as before


def test_bad_sweep_select(menu_run, capsys):
    line = one_error_line(*run_cli(capsys, "sweep", menu_run.profile, "--select-seq-len", "64"))
    assert line.endswith("--select-seq-len needs --select-measured N")
    line = one_error_line(*run_cli(capsys, "sweep", menu_run.profile, "--target", "sglang", "--avg-bits", "8",
                                   "--select-measured", "1", "--device", "cpu", "--out", "never"))
    assert "target sglang takes one type for every layer" in line
    assert not os.path.exists("never/plan-8bits.json")


def test_bad_sweep_uniform(menu_run, capsys):
    rc, out, err = run_cli(capsys, "sweep", menu_run.profile, "--uniform", "some")
    assert "--uniform 'some' is not frontier, all or none" in one_error_line(rc, out, err)


def test_refine_rounds_are_recorded_and_never_worse(menu_run, tmp_path, capsys):
    out = tmp_path / "refined.json"
    rc, stdout, err = run_cli(capsys, "plan", menu_run.profile, "--avg-bits", "4", "--refine", "2",
                              "--select-measured", "0", "--device", "cpu", "--out", str(out))
    assert rc == 0, err  # (without --select-measured 0 a candidate that was never refined may be chosen)
    plan = json.loads(out.read_text())
    rounds = plan["solver"]["refine"]
    assert rounds[0]["round"] == 0 and rounds[0]["cells_measured"] == 0
    assert len(rounds) >= 2 and all(r["cells_measured"] > 0 for r in rounds[1:])
    assert all(1 <= r["bound"] and r["changed"] <= r["bound"] for r in rounds[1:])  # the trust region held
    assert max(r["round"] for r in rounds) <= 2
    kept = min(r["measured_kl"] for r in rounds)
    assert all(math.isfinite(r["measured_kl"]) and r["measured_kl"] > 0 for r in rounds)
    assert "refine round 1:" in stdout
    assert plan["predicted"]["avg_bits"] <= 4 + 1e-9
    from sensprof.artifacts import load_plan
    from sensprof.models import load_for_plan
    from sensprof.validation.validate import measure
    from sensprof.data import select_windows

    p = load_plan(str(out))
    loaded = load_for_plan(p, None, "cpu")
    s = p.profile.settings
    ids = select_windows(loaded.tokenizer, None, s["seq_len"], s["windows"], s["seed"])[0]
    assert measure(loaded.model, ids, {"plan": p.layers})["plan"]["kl"] == pytest.approx(kept, rel=1e-6)


def test_refine_bad_input(menu_run, capsys, tmp_path):
    rc, out, err = run_cli(capsys, "plan", menu_run.profile, "--avg-bits", "4", "--refine", "-1")
    assert "--refine -1 is negative" in one_error_line(rc, out, err)
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(menu_run.profile, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["text_files"] = [str(tmp_path / "gone.txt")]
    (copy / "meta.json").write_text(json.dumps(meta))
    rc, out, err = run_cli(capsys, "plan", str(copy), "--avg-bits", "4", "--refine", "1", "--out",
                           str(tmp_path / "p.json"))
    assert "gone.txt' is gone; restore it or drop --refine" in one_error_line(rc, out, err)
    changed = copy / "changed.txt"  # there, but not the text that was profiled (issue 24)
    changed.write_text("other words " * 4000)
    meta["text_files"] = [str(changed)]
    (copy / "meta.json").write_text(json.dumps(meta))
    rc, out, err = run_cli(capsys, "plan", str(copy), "--avg-bits", "4", "--refine", "1", "--device", "cpu", "--out",
                           str(tmp_path / "p.json"))
    line = one_error_line(rc, out, err)
    assert "changed.txt' is not the text that was profiled" in line and "restore that text or drop --refine" in line
    assert not (tmp_path / "p.json").exists()


def test_robust_objective_prefers_the_steadier_scheme():
    from sensprof.planning.budget import Budget
    from sensprof.planning.planner import plan, problem_from_table
    from sensprof.targets import get_target

    layers = [{"index": 0, "kind": "full", "window": None, "kv_heads": 1, "q_heads": 1, "head_dim": 64}]
    rows = [("K", "int4_c32", 1.0, 5.0), ("K", "int4_c128", 1.1, 0.0), ("V", "int4_t32", 1.0, 0.0)]
    table = pd.DataFrame([{"layer": 0, "tensor": t, "scheme": s, "kl": kl, "kl_std": sd, "dnll": 0.0,
                           "out_rel_l2": 0.0} for t, s, kl, sd in rows])
    budget, target = Budget("avg_bits", 5.0), get_target("sensprof")
    assert plan(problem_from_table(table, layers), target, budget).choices == [("int4_c32", "int4_t32")]
    assert plan(problem_from_table(table, layers, robust=1.0), target, budget).choices == [("int4_c128", "int4_t32")]
    from sensprof.errors import SensprofError

    with pytest.raises(SensprofError, match="--objective kl"):
        problem_from_table(table, layers, "dnll", robust=1.0)
    with pytest.raises(SensprofError, match="negative"):
        problem_from_table(table, layers, robust=-1.0)


def test_robust_plan_records_its_weight(menu_run, tmp_path):
    out = tmp_path / "robust.json"
    assert main(["plan", menu_run.profile, "--avg-bits", "4", "--robust", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["solver"]["robust"] == 1.0


@pytest.mark.parametrize("argv, match", [
    (["--k-schemes", "int4_t32"], "is a value layout"),
    (["--v-schemes", "int4_c32_pre"], "quantizes before RoPE"),
    (["--v-schemes", "turboquant_k8v4.K"], "key-only format"),
    (["--seq-len", "32,100000"], "--seq-len 100000 is beyond the model's 512 positions"),
    (["--kl", "sampled:x"], "--kl 'sampled:x'"),
])
def test_profile_menu_bad_input(menu_run, capsys, tmp_path, argv, match):
    rc, out, err = run_cli(capsys, "profile", "--model", menu_run.model, "--device", "cpu", "--out",
                           str(tmp_path / "p"), *argv)
    assert match in one_error_line(rc, out, err)
    assert not (tmp_path / "p").exists()


def test_trust_region_bounds_the_changed_choices(menu_run):
    from sensprof.planning.budget import Budget
    from sensprof.profiling.table import usable_cells
    from sensprof.planning.planner import plan, problem_from_table
    from sensprof.targets import get_target

    prof = load_profile(menu_run.profile)
    problem = problem_from_table(usable_cells(prof), prof.meta["layers"])
    target = get_target("sensprof")
    start = plan(problem, target, Budget("avg_bits", 8.0)).choices
    free = plan(problem, target, Budget("avg_bits", 4.0)).choices
    far = sum(a != b for p, q in zip(start, free) for a, b in zip(p, q))
    assert far > 2
    for bound in (1, 2):
        near = plan(problem, target, Budget("avg_bits", 7.5), near=(start, bound))
        assert 1 <= sum(a != b for p, q in zip(start, near.choices) for a, b in zip(p, q)) <= bound
        assert near.cost <= near.limit * (1 + 1e-9)
    with pytest.raises(SensprofError, match="per-layer choices"):
        plan(problem, get_target("sglang"), Budget("avg_bits", 8.0), near=(start, 1))


def test_a_profile_of_two_lengths_measures_its_extrapolation(menu_run):
    """The plan's pricing extrapolates from 128 tokens to the serving length; the profile's 64-token length measures
    how well the same rule carries 64 tokens to 128 (sensprof.planning.pricing.extrapolation_error)."""
    from sensprof.planning.budget import Budget
    from sensprof.planning.plan import make_plan
    from sensprof.planning.pricing import scale

    plan = make_plan(menu_run.profile, "sensprof", Budget("avg_bits", 6))
    err = plan.predicted.pricing["extrapolation_error"]
    assert err["from_len"] == 64 and err["to_len"] == 128
    short = load_profile(os.path.join(menu_run.profile, "lengths", "64")).table
    long = load_profile(menu_run.profile).table
    for s in ("int4_c32", "int4_t32"):
        a, b = short[short.scheme == s].kl.sum(), long[long.scheme == s].kl.sum()
        assert err["measured_over_extrapolated"][s] == pytest.approx(b / (a * scale(s, "streaming", 64, 128)), rel=1e-3)
    assert "int4_c128" not in err["measured_over_extrapolated"]  # a 64-token window holds no whole 128-token group
