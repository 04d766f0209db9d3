"""`plan --select-measured N` (sensprof.planning.selection) on a tiny random model: the final plan is the candidate with the
lowest measured KL on windows neither the profile nor validate uses; a uniform configuration that wins is the plan."""

from __future__ import annotations

import json
import shutil
import types

import pandas as pd
import pytest
import torch
from conftest import one_error_line, run_cli

from sensprof.artifacts import load_plan
from sensprof.cli import main
from sensprof.models import load_model
from sensprof.planning.pricing import priced_at
from sensprof.data import bos_prefix
from sensprof.planning.selection import selection_windows, short_chunks
from sensprof.profiling.table import load_profile
from sensprof.validation.validate import layer_choices, measure, predicted_damage, validation_table, validation_windows

K = "int2_c32,int4_c32,int8_c32"
V = "int2_t32,int4_t32,int8_t32"


@pytest.fixture(scope="module")
def sel(tiny_model_dir, tmp_path_factory, _one_thread):
    root = tmp_path_factory.mktemp("select")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--k-schemes", K,
                 "--v-schemes", V, "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), model=tiny_model_dir)


def _plan(capsys, profile, out, *extra):
    rc, stdout, err = run_cli(capsys, "plan", profile, "--avg-bits", "5", "--select-measured", "2", "--device", "cpu",
                              "--out", out, *extra)
    assert rc == 0, err
    return load_plan(str(out)), stdout


def test_the_plan_is_the_candidate_measured_best(sel, capsys):
    plan, out = _plan(capsys, sel.profile, sel.root / "p.json", "--select-uniforms", "menus")
    s = plan.solver.select
    assert s["windows"] == 2 and s["seq_len"] == 128 and s["reads"] == "streaming"  # 4x the profile's 32 tokens
    names = [c["name"] for c in s["candidates"]]
    assert names[0] == "plan" and any(c["uniform"] for c in s["candidates"])
    best = min(s["candidates"], key=lambda c: c["measured_kl"])
    assert s["chosen"] == best["name"] and s["uniform_won"] == best["uniform"]
    for c in s["candidates"]:  # every candidate fits the budget
        assert c["budget_used"] <= plan.predicted.budget_limit * (1 + 1e-9)
        assert c["measured_kl"] > 0
    assert "chosen by measured KL on 2 x 128 unseen tokens" in out
    # the chosen candidate's joint damage over its per-layer sum, at the windows' length and at the profile's (the
    # windows' first 32 tokens): recorded, and carried into validate's prediction for the plan (no other row)
    assert best["predicted_kl_here"] > 0
    assert s["joint_factor"]["128"] == pytest.approx(best["measured_kl"] / best["predicted_kl_here"], abs=1e-4)
    assert set(s["joint_factor"]) == {"32", "128"} and plan.predicted.joint_factor == s["joint_factor"]
    assert plan.predicted.joint_factor_at(128) == s["joint_factor"]["128"]
    assert plan.predicted.joint_factor_at(40) == s["joint_factor"]["32"]  # the nearest measured length
    assert plan.predicted.joint_factor_at(1024) == s["joint_factor"]["128"]
    assert "(128 tokens) the per-layer sum; validate's prediction carries it" in out
    assert f"{s['joint_factor']['32']:.2f}x (32 tokens), " in plan.describe()
    from sensprof.export import memory_comments  # and export's comment beside the command line says it too

    said = memory_comments(plan, 80.0)[-1]
    assert said.startswith(f"# predicted damage (sum of per-layer kl): {plan.predicted.damage:.3e}; all layers")
    assert said.endswith(f"measured {plan.predicted.joint_summary()} that sum")
    profile = load_profile(sel.profile)
    configs = {"plan": plan.layers, "other": layer_choices(plan, ("int8_c32", "int8_t32"))}
    fake = {name: {"kl": 0.5, "kl_std": 0.0, "dnll": 0.1, "dppl": 0.2} for name in configs}
    for n in (32, 128):
        df = validation_table(plan, fake, configs, profile.table, n, profile.meta).set_index("config")
        at = priced_at(profile.table, "streaming", 32, n)
        assert df.loc["plan", "predicted_kl"] == pytest.approx(
            predicted_damage(at, plan.layers) * plan.predicted.joint_factor_at(n))
        assert df.loc["other", "predicted_kl"] == pytest.approx(predicted_damage(at, configs["other"]))
    # the windows it chose on: none of the profile's, none of those validate will judge the plan on
    loaded = load_model(sel.model, "cpu")
    tok = loaded.tokenizer
    chosen_on, slots = selection_windows(tok, plan, 2, 128)
    assert slots == s["window_slots"]
    # the factor at the profile's length: the plan measured on every 32-token chunk of those windows (each with the
    # tokenizer's prefix) over its sum there
    prefix = len(bos_prefix(tok))
    chunks = short_chunks(chosen_on, 32, prefix)
    assert chunks.shape == (2 * ((128 - prefix) // (32 - prefix)), 32)
    assert s["joint_factor_windows"] == {"32": chunks.shape[0], "128": 2}
    short = measure(loaded.model, chunks, {"plan": plan.layers})["plan"]["kl"]
    assert s["joint_factor"]["32"] == pytest.approx(short / predicted_damage(profile.table, plan.layers), abs=1e-4)
    chosen_text = [",".join(map(str, r.tolist()[1:])) for r in chosen_on]
    for n in (32, 128):  # no window validate judges on shares text with the selection's (the BOS aside)
        for r in validation_windows(plan, tok, 2, n):
            body = ",".join(map(str, r.tolist()[1:9]))  # its first 8 tokens after the BOS
            assert not any(body in c for c in chosen_text), n


def test_every_uniform_configuration_sensprof_stores_is_a_baseline(sel, tmp_path, capsys, monkeypatch):
    """By default the baselines come from every uniform configuration sensprof stores within the budget (here the
    menus hold int2/4/8 only): each scheme screened alone on one window, the three best pairs measured whole; one
    that measures below every plan is the plan, its layers' damage from the screen where the profile has no cell."""
    from sensprof.planning.budget import Budget
    from sensprof.planning.uniforms import candidates
    from sensprof.validation import baselines

    monkeypatch.setattr(baselines, "SCREEN_TOKENS", 64)  # a floor below the selection's 128-token windows
    plan, out = _plan(capsys, sel.profile, tmp_path / "p.json")
    s = plan.solver.select
    screen = s["uniform_screen"]
    assert screen["tokens"] == 128  # the whole of the selection's window: ranked at the length it judges at
    meta_layers = [{"kv_heads": p.kv_heads, "head_dim": p.head_dim, "kind": p.kind, "window": p.window}
                   for p in plan.layers]
    found = candidates(Budget("avg_bits", 5.0), meta_layers, pre_rope=True)  # the tiny Llama: RoPE on every layer
    assert set(screen["k"]) == {c.k for c in found} - {"none"}
    assert any(k not in K.split(",") for k in screen["k"])  # outside the menus
    assert any("_pre" in k for k in screen["k"])  # keys before RoPE too
    uniforms = [c for c in s["candidates"] if c["uniform"]]
    assert len(uniforms) == 3 and all(c["name"].startswith("uniform ") for c in uniforms)
    summed = sorted(screen["k"].get(c.k, 0.0) + screen["v"].get(c.v, 0.0) for c in found)
    for c in uniforms:
        k, v = c["name"].removeprefix("uniform ").split(" / ")
        assert screen["k"].get(k, 0.0) + screen["v"].get(v, 0.0) <= summed[2] + 1e-15
        assert c["budget_used"] <= plan.predicted.budget_limit * (1 + 1e-9)
    # the plan also with sinks and 32 recent tokens kept on every grouped layer (free in a long-context budget)
    from sensprof.planning.uniforms import keep_recent

    raw = load_plan_candidates(sel.profile, tmp_path)
    kept = next(c for c in s["candidates"] if c["name"] == "plan + sinks and 32 recent tokens")
    assert kept["budget_used"] <= plan.predicted.budget_limit * (1 + 1e-9) and not kept["uniform"]
    assert any(keep_recent(p.k_scheme) != p.k_scheme for p in raw)
    # the menus hold no `_r32_s4` scheme: its sums are the plan's own cells', an upper bound (kept tokens only
    # remove error), so a plan chosen so still has a prediction to print and a joint factor to carry
    own = next(c for c in s["candidates"] if c["name"] == "plan")
    assert kept["predicted_kl"] == pytest.approx(own["predicted_kl"])
    assert kept["predicted_kl_here"] == pytest.approx(own["predicted_kl_here"])
    # and each plan with its keys before RoPE (every layer of the tiny Llama has RoPE), in the same memory, priced by
    # the cells of its keys' twins after RoPE (the menus hold no `_pre` key), and measured apart from the plan
    for name in ("plan", "plan + sinks and 32 recent tokens"):
        mine = next(c for c in s["candidates"] if c["name"] == name)
        moved = next(c for c in s["candidates"] if c["name"] == f"{name}, keys before RoPE")
        assert moved["budget_used"] == pytest.approx(mine["budget_used"]) and not moved["uniform"]
        assert moved["predicted_kl"] == pytest.approx(mine["predicted_kl"])
        assert moved["measured_kl"] != mine["measured_kl"]
    best = min(s["candidates"], key=lambda c: c["measured_kl"])
    assert s["chosen"] == best["name"] and s["uniform_won"] == best["uniform"]
    assert best["uniform"]  # on this tiny model one does (int6 values, outside the menus): the plan is it
    k, v = best["name"].removeprefix("uniform ").split(" / ")
    assert k not in K.split(",") or v not in V.split(",")
    assert {(p.k_scheme, p.v_scheme) for p in plan.layers} == {(k, v)}
    assert f"the uniform configuration {k} / {v} measured lower KL than every plan" in out
    assert all(p.k_damage >= 0 and p.v_damage >= 0 for p in plan.layers)
    assert plan.predicted.damage == pytest.approx(best["predicted_kl"])


def test_short_chunks_cut_every_whole_profile_window_from_the_longer_ones():
    ids = torch.arange(2 * 11).reshape(2, 11)
    ids[:, 0] = -1  # a one-token prefix (a BOS)
    chunks = short_chunks(ids, 4, 1)
    assert chunks.tolist() == [[-1, 1, 2, 3], [-1, 12, 13, 14], [-1, 4, 5, 6], [-1, 15, 16, 17],
                               [-1, 7, 8, 9], [-1, 18, 19, 20]]
    assert short_chunks(ids, 4, 0).shape == (4, 4)  # no prefix: 11 // 4 whole windows per row
    assert short_chunks(ids[:, :3], 4, 1).tolist() == ids[:, :3].tolist()  # shorter than one: the window as is


def test_a_uniform_configuration_that_measures_best_is_the_plan(sel, tmp_path, capsys):
    """A profile that lies (int2 values free, int4/int8 values ruinous): every plan takes int2 values, and the
    uniform configuration that spends the budget measures lower: the plan becomes it and says so."""
    bad = tmp_path / "lying-profile"
    shutil.copytree(sel.profile, bad)
    t = pd.read_csv(bad / "profile.csv")
    two = (t.tensor == "V") & (t.scheme == "int2_t32")
    rich = (t.tensor == "V") & (t.scheme != "int2_t32")
    t.loc[two, ["kl", "kl_std", "dnll"]] = [1e-9, 0.0, 1e-9]
    t.loc[rich, ["kl", "kl_std", "dnll"]] = [1.0, 0.0, 1.0]
    t.to_csv(bad / "profile.csv", index=False)
    plan, out = _plan(capsys, str(bad), tmp_path / "p.json", "--select-uniforms", "menus")
    s = plan.solver.select
    assert all(p.v_scheme == "int2_t32" for p in load_plan_candidates(str(bad), tmp_path))
    assert s["uniform_won"] and s["chosen"] == "uniform int4_c32 / int4_t32"
    assert {(p.k_scheme, p.v_scheme) for p in plan.layers} == {("int4_c32", "int4_t32")}
    assert "the uniform configuration int4_c32 / int4_t32 measured lower KL than every plan" in out
    assert json.load(open(tmp_path / "p.json"))["solver"]["select"]["uniform_won"] is True


def load_plan_candidates(profile, tmp_path):
    """The planner's own plan from that profile (no selection): its layers."""
    assert main(["plan", profile, "--avg-bits", "5", "--select-measured", "0", "--out", str(tmp_path / "raw.json")]) == 0
    return load_plan(str(tmp_path / "raw.json")).layers


def test_select_measured_bad_input(sel, tmp_path, capsys):
    out = ("--out", tmp_path / "p.json")
    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "-1", *out))
    assert "--select-measured N takes a number of windows" in line
    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "0",
                                   "--select-seq-len", "64", *out))
    assert "--select-seq-len needs --select-measured N" in line
    assert not (tmp_path / "p.json").exists()
    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "1",
                                   "--select-seq-len", "100000", "--device", "cpu"))
    assert "beyond the model's 512 positions" in line


def test_plan_chooses_by_measurement_by_default_and_says_when_it_did_not(sel, tmp_path, capsys):
    """No flag: the plan is chosen among the candidates on 2 unseen windows; --select-measured 0 keeps the
    planner's plan and says it was chosen by prediction alone."""
    rc, out, err = run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--device", "cpu", "--out",
                           tmp_path / "d.json")
    assert rc == 0, err
    s = load_plan(str(tmp_path / "d.json")).solver.select
    assert s["windows"] == 2 and len(s["candidates"]) >= 2 and "chosen by measured KL on 2 x" in out
    assert "chosen by predicted damage alone" not in out
    rc, out, err = run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "0", "--out",
                           tmp_path / "p.json")
    assert rc == 0, err
    assert "chosen by predicted damage alone: --select-measured 2" in out
    assert load_plan(str(tmp_path / "p.json")).solver.select is None


def test_a_default_selection_that_cannot_run_names_the_way_out(sel, tmp_path, capsys):
    """The profile's text is gone: the default selection fails in one line that offers --select-measured 0,
    writes nothing, and --select-measured 0 plans without it."""
    moved = tmp_path / "profile"
    shutil.copytree(sel.profile, moved)
    meta = json.load(open(moved / "meta.json"))
    meta["text_files"] = [str(tmp_path / "gone.txt")]
    (moved / "meta.json").write_text(json.dumps(meta))
    line = one_error_line(*run_cli(capsys, "plan", str(moved), "--avg-bits", "5", "--out", tmp_path / "p.json"))
    assert "gone.txt" in line and "--select-measured 0" in line
    assert not (tmp_path / "p.json").exists()
    rc, _, err = run_cli(capsys, "plan", str(moved), "--avg-bits", "5", "--select-measured", "0", "--out",
                         tmp_path / "p.json")
    assert rc == 0, err


@pytest.fixture(scope="module")
def vsel(tiny_model_dir, tmp_path_factory, _one_thread):
    root = tmp_path_factory.mktemp("select-vllm")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--target", "vllm", "--seq-len", "32", "--windows", "2",
                 "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), model=tiny_model_dir)


def _vllm_plan(capsys, profile, out, bits="9"):
    rc, stdout, err = run_cli(capsys, "plan", profile, "--target", "vllm", "--avg-bits", bits, "--select-measured",
                              "2", "--device", "cpu", "--out", out)
    assert rc == 0, err
    return load_plan(str(out)), stdout


def _vllm_dtype_alone(layers, forced) -> bool:
    pairs = {(p.k_scheme, p.v_scheme) for p in layers if p.layer not in forced}
    return len(pairs) == 1 and all((p.k_scheme, p.v_scheme) == ("none", "none") for p in layers if p.layer in forced)


def test_vllm_plans_are_chosen_among_the_plan_and_each_dtype_alone(vsel, capsys):
    """Target vllm: the candidates are the plan (one dtype plus kept layers), its other-objective plans, and each
    vLLM dtype alone that fits; every one is measured read `all`, and the plan is the lowest."""
    plan, out = _vllm_plan(capsys, vsel.profile, vsel.root / "p.json")
    s = plan.solver.select
    assert s["reads"] == "all" and s["seq_len"] == 128
    uniform = [c for c in s["candidates"] if c["uniform"]]
    assert uniform and all(c["name"].startswith("uniform vllm ") for c in uniform)
    assert len({c["name"] for c in s["candidates"]}) == len(s["candidates"])  # both fp8 dtypes named apart
    for c in s["candidates"]:
        assert c["budget_used"] <= plan.predicted.budget_limit * (1 + 1e-9) and c["measured_kl"] > 0
    best = min(s["candidates"], key=lambda c: c["measured_kl"])
    assert s["chosen"] == best["name"] and s["uniform_won"] == best["uniform"]
    assert plan.target == "vllm" and plan.predicted.joint_factor == s["joint_factor"]
    if s["uniform_won"]:  # a dtype alone: vLLM keeps only its own boundary layers
        assert list(plan.engine.skip_layers) == list(plan.engine.forced_skip_layers)
        assert _vllm_dtype_alone(plan.layers, set(plan.engine.forced_skip_layers))
    assert "chosen by measured KL on 2 x 128 unseen tokens" in out


def test_a_vllm_dtype_alone_that_measures_best_is_the_plan(vsel, tmp_path, capsys):
    """A profile that lies (int4_per_token_head free, everything else ruinous): every plan is int4 with layers kept,
    and a dtype alone measures lower: the plan becomes it, engine settings and all."""
    bad = tmp_path / "lying-profile"
    shutil.copytree(vsel.profile, bad)
    t = pd.read_csv(bad / "profile.csv")
    lie = t.scheme == "int4_per_token_head"
    t.loc[lie, ["kl", "kl_std", "dnll"]] = [1e-3, 0.0, 1e-3]
    t.loc[~lie, ["kl", "kl_std", "dnll"]] = [1.0, 0.0, 1.0]
    t.to_csv(bad / "profile.csv", index=False)
    assert main(["plan", str(bad), "--target", "vllm", "--avg-bits", "9", "--select-measured", "0", "--out",
                 str(tmp_path / "raw.json")]) == 0
    raw = load_plan(str(tmp_path / "raw.json"))
    assert raw.engine.kv_cache_dtype == "int4_per_token_head" and raw.engine.skip_layers
    plan, out = _vllm_plan(capsys, str(bad), tmp_path / "p.json")
    s = plan.solver.select
    assert s["uniform_won"] and s["chosen"].startswith("uniform vllm ")
    assert plan.engine.kv_cache_dtype in s["chosen"] and not plan.engine.skip_layers
    assert _vllm_dtype_alone(plan.layers, set())
    assert f"the uniform configuration {s['chosen'].removeprefix('uniform ')} measured lower KL" in out
    flags = plan.engine.flags()
    assert flags["kv_cache_dtype"] == plan.engine.kv_cache_dtype and "kv_cache_dtype_skip_layers" not in flags


def test_select_measured_refuses_what_it_cannot_choose(vsel, capsys):
    line = one_error_line(*run_cli(capsys, "plan", vsel.profile, "--target", "vllm", "--avg-bits", "9",
                                   "--select-measured", "2", "--num-skip", "1"))
    assert "--num-skip 1 fixes how many layers the plan keeps" in line and "drop one of them" in line
    line = one_error_line(*run_cli(capsys, "plan", vsel.profile, "--target", "sglang", "--avg-bits", "9",
                                   "--select-measured", "2", "--device", "cpu"))
    assert "target sglang takes one type for every layer" in line and "--target sensprof or vllm" in line


def test_selection_and_refine_measure_only_the_profiled_model(sel, capsys, tmp_path, tiny_tokenizer):
    """--select-measured and --refine measured whatever --model named (or meta.json's edited model id) and wrote
    the result into a plan naming the profile's model; a raised max_positions was trusted. Each is one line now."""
    import json

    from conftest import make_tiny_model, one_error_line
    from test_cli import save_model_dir

    other = save_model_dir(make_tiny_model("llama", seed=1), tmp_path / "other", tiny_tokenizer)
    for extra in (["--select-measured", "2"], ["--select-measured", "0", "--refine", "1"]):
        line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--device", "cpu",
                                       "--model", other, *extra, "--out", str(tmp_path / "p.json")))
        assert "the plan was made for model fingerprint" in line and other in line
    assert not (tmp_path / "p.json").exists()
    edited = tmp_path / "edited"
    shutil.copytree(sel.profile, edited)
    meta = json.load(open(edited / "meta.json"))
    meta["max_positions"] = 100_000
    (edited / "meta.json").write_text(json.dumps(meta))
    line = one_error_line(*run_cli(capsys, "plan", str(edited), "--avg-bits", "5", "--device", "cpu",
                                   "--select-measured", "2", "--select-seq-len", "64"))
    assert "meta.json says the model has 100000 positions, but it has" in line


def _unseen_text() -> str:
    """The user's own text, none of it in the built-in corpus a profile reads: a standard-library module the
    mixture leaves out."""
    import difflib
    import inspect

    return inspect.getsource(difflib)


def test_selection_on_the_users_own_text(sel, capsys, tmp_path):
    """plan --select-measured N --select-text FILE chooses on the user's text and records which; validate --text on
    the same text is refused (it chose the plan), as are --select-text without a selection and the profile's text."""
    from conftest import one_error_line
    mine = tmp_path / "mine.txt"
    mine.write_text(_unseen_text()[-30_000:])
    plan, out = _plan(capsys, sel.profile, tmp_path / "p.json", "--select-text", str(mine))
    s = plan.solver.select
    assert s["text"] == "mine.txt" and len(s["text_digest"]) > 8 and s["windows"] == 2
    assert "unseen tokens of mine.txt among" in out
    line = one_error_line(*run_cli(capsys, "validate", str(tmp_path / "p.json"), "--device", "cpu", "--text", mine))
    assert "is the text `plan --select-text` chose the plan on" in line
    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "0",
                                   "--select-text", mine))
    assert "--select-text is the text --select-measured chooses on, and --select-measured is 0" in line
    from sensprof.profiling.table import load_meta
    from sensprof.data import builtin_corpus as corpus, text_digest

    assert load_meta(sel.profile)["settings"]["text_digest"] == text_digest(corpus())  # profiled on the built-in text
    own = tmp_path / "own.txt"
    own.write_text(corpus())
    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "2",
                                   "--select-text", own, "--device", "cpu"))
    assert "--select-text own.txt is the text the plan was profiled on" in line


def test_sweep_and_plan_select_on_a_folder_of_the_users_text(sel, capsys, tmp_path):
    """sweep --select-text: each budget's plan chosen on the user's text as plan --select-text chooses it (the same
    plan, the same record); a folder's files are recorded as read (hidden ones skipped); without --select-measured,
    sweep refuses it as plan does."""
    corpus = _unseen_text()
    mine = tmp_path / "mine"
    (mine / "b").mkdir(parents=True)
    (mine / "a.txt").write_text(corpus[-30_000:-15_000])
    (mine / "b" / "c.jsonl").write_text("\n".join(json.dumps({"text": corpus[i:i + 1000]})
                                                  for i in range(len(corpus) - 15_000, len(corpus) - 1000, 1000)))
    (mine / ".skip.txt").write_text("hidden")
    plan, _ = _plan(capsys, sel.profile, tmp_path / "p.json", "--select-text", str(mine))
    s = plan.solver.select
    assert s["text"] == "mine" and s["text_files"] == [str(mine / "a.txt"), str(mine / "b" / "c.jsonl")]
    out = tmp_path / "sweep"
    rc, stdout, err = run_cli(capsys, "sweep", sel.profile, "--avg-bits", "5", "--select-measured", "2",
                              "--select-text", mine, "--device", "cpu", "--out", out)
    assert rc == 0, err
    swept = load_plan(str(out / "plan-5bits.json"))
    assert swept.solver.select == s and swept.layers == plan.layers
    line = one_error_line(*run_cli(capsys, "sweep", sel.profile, "--avg-bits", "5", "--select-text", mine,
                                   "--out", tmp_path / "s2"))
    assert "--select-text is the text --select-measured chooses on, and --select-measured is 0" in line
    assert not (tmp_path / "s2").exists()


def test_selection_beyond_the_served_context_is_refused(sel, capsys):
    from conftest import one_error_line

    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "2",
                                   "--context-len", "64", "--select-seq-len", "128", "--device", "cpu"))
    assert "--select-seq-len 128 is beyond the served context of 64 tokens" in line


def test_a_dnll_candidate_that_wins_states_its_prediction_in_kl(sel, capsys, tmp_path, monkeypatch):
    """When the other-objective (dNLL) plan measures best, the plan's printed prediction is its KL sum (the joint
    factor is quoted against it), not a dNLL sum shown as 'pred KL nan'."""
    import sensprof.validation.validate as validate

    real = validate.measure

    def dnll_plan_wins(model, ids, configs, *a, **k):
        out = real(model, ids, configs, *a, **k)
        if "plan (objective dnll)" in out:  # half the best candidate's KL at every position: a lead beyond noise
            best = min((m for m in out.values() if "kl" in m), key=lambda m: m["kl"])
            out["plan (objective dnll)"] = {**out["plan (objective dnll)"], "kl": best["kl"] / 2,
                                            "kl_tokens": best["kl_tokens"] / 2}
        return out

    monkeypatch.setattr(validate, "measure", dnll_plan_wins)
    plan, out = _plan(capsys, sel.profile, tmp_path / "p.json")
    assert plan.solver.select["chosen"] == "plan (objective dnll)" and plan.objective == "dnll"
    assert plan.predicted.objective == "kl"
    row = next(r for r in plan.solver.select["candidates"] if r["name"] == "plan (objective dnll)")
    assert plan.predicted.damage == pytest.approx(row["predicted_kl"]) and plan.predicted.damage > 0


def test_too_many_selection_windows_name_the_selection_flags(sel, capsys):
    from conftest import one_error_line

    line = one_error_line(*run_cli(capsys, "plan", sel.profile, "--avg-bits", "5", "--select-measured", "100000",
                                   "--device", "cpu"))
    assert "pass a longer --select-text, fewer --select-measured or a smaller --select-seq-len" in line


def test_the_k_v_split_is_learnt_again_at_the_selections_length(sel, capsys, tmp_path, monkeypatch):
    """Keys alone and values alone, measured over their price at the selection's length, weigh the key cells of a
    re-solved candidate: heavier keys get more bits within the same budget, and selection measures that plan too."""
    import dataclasses

    from sensprof.planning import selection
    from sensprof.planning.budget import Budget
    from sensprof.planning.plan import make_plan, priced_table
    from sensprof.schemes import get_scheme
    from sensprof.targets import get_target

    plan, _ = _plan(capsys, sel.profile, tmp_path / "p.json", "--select-uniforms", "menus")
    budget = Budget("avg_bits", 5)
    base = make_plan(sel.profile, "sensprof", budget)  # the selection's first candidate
    loaded = load_model(sel.model, "cpu")
    ids, _ = selection_windows(loaded.tokenizer, base, 2, 128)
    profile = load_profile(sel.profile)
    growth = selection._kv_growth(loaded.model, ids, base, profile, 32, "streaming")
    assert plan.solver.select["kv_growth"] == growth and growth["seq_len"] == 128
    at = priced_at(profile.table, "streaming", 32, 128, profile.meta["layers"])
    for tensor, drop in (("k", "v_scheme"), ("v", "k_scheme")):
        alone = [dataclasses.replace(p, **{drop: "none"}) for p in base.layers]
        kl = measure(loaded.model, ids, {"x": alone})["x"]["kl"]
        assert growth[tensor] == pytest.approx(kl / predicted_damage(at, alone), abs=1e-4)

    def bits(p, tensor):
        return sum(get_scheme(getattr(q, f"{tensor}_scheme")).bits for q in p.layers)

    table, pricing = priced_table(profile, "sensprof", get_target("sensprof"), base.predicted.pricing["context_len"])
    heavy = selection._rebalanced(base, profile, table, pricing, get_target("sensprof"), budget, 1e4)
    assert bits(heavy, "k") > bits(base, "k") and bits(heavy, "v") < bits(base, "v")
    assert heavy.predicted.budget_used <= base.predicted.budget_limit * (1 + 1e-9)  # the same budget
    assert heavy.predicted.damage == pytest.approx(predicted_damage(table, heavy.layers))  # the profile's cells
    assert selection._rebalanced(base, profile, table, pricing, get_target("sensprof"), budget, 1.0) is None

    monkeypatch.setattr(selection, "_kv_growth", lambda *a: {"k": 1e4, "v": 1.0, "seq_len": 128})
    forced, out = _plan(capsys, sel.profile, tmp_path / "q.json", "--select-uniforms", "menus")
    names = [c["name"] for c in forced.solver.select["candidates"]]
    assert "plan (keys weighted x10000.00)" in names, names
    assert "plan (keys weighted x10000.00)" in out
    assert "select: at 128 tokens the plan's keys alone measured 10000.00x their price, its values alone 1.00x; the " \
           "plan with keys weighted so is a candidate" in out


def _rows_and_tokens(plan_tokens, uniform_tokens):
    measured = {"plan": {"kl": float(plan_tokens.mean()), "kl_tokens": plan_tokens},
                "uniform a / b": {"kl": float(uniform_tokens.mean()), "kl_tokens": uniform_tokens}}
    rows = [{"name": n, "uniform": n.startswith("uniform"), "measured_kl": m["kl"]} for n, m in measured.items()]
    return rows, measured


def test_a_plans_lead_counts_only_beyond_one_standard_error():
    """plan_lead: the lead is the printed difference; its noise the standard error of the paired per-position
    differences averaged over 8 contiguous blocks per window."""
    from sensprof.planning.selection import LEAD_BLOCKS_PER_WINDOW, plan_lead

    g = torch.Generator().manual_seed(0)
    uniform = torch.rand(2, 64, generator=g, dtype=torch.float64) + 1.0
    rows, measured = _rows_and_tokens(uniform * 0.9, uniform)  # 10% lower at every position: beyond noise
    lead = plan_lead(rows, measured)
    assert lead["plan"] == "plan" and lead["uniform"] == "uniform a / b" and lead["beyond_noise"]
    assert lead["lead"] == pytest.approx(float(uniform.mean()) * 0.1)
    assert lead["blocks"] == 2 * LEAD_BLOCKS_PER_WINDOW and lead["block_tokens"] == 8
    blocks = (uniform * -0.1).reshape(2, 8, 8).mean(-1).flatten()
    assert lead["standard_error"] == pytest.approx(float(blocks.std() / 4))
    assert lead["ratio"] == pytest.approx(0.9, abs=1e-4)

    swing = torch.tensor([0.5, -0.5], dtype=torch.float64).repeat_interleave(8).repeat(2, 4)  # +-0.5 block by block
    rows, measured = _rows_and_tokens(uniform * 0.99 + swing, uniform)  # 1% lower on average, 50% either way
    lead = plan_lead(rows, measured)
    assert 0 < lead["lead"] < lead["standard_error"] and not lead["beyond_noise"]

    rows, measured = _rows_and_tokens(uniform * 1.1, uniform)  # the uniform measures best: nothing to weigh
    assert plan_lead(rows, measured) is None
    assert plan_lead([r for r in rows if not r["uniform"]], measured) is None
    rows, measured = _rows_and_tokens(uniform[:, :4] * 0.5, uniform[:, :4])  # fewer positions than blocks
    assert plan_lead(rows, measured) is None


def test_a_plan_that_leads_within_the_noise_gives_way_to_the_uniform(sel, capsys, tmp_path, monkeypatch):
    """The one-standard-error rule in the selection: a plan that measures lowest by less than the noise of the
    windows is not kept; the best uniform configuration is the plan, and the plan says why."""
    import sensprof.validation.validate as validate

    real = validate.measure

    def plan_barely_ahead(model, ids, configs, *a, **k):
        out = real(model, ids, configs, *a, **k)
        if "plan" in out and "kl_tokens" in out["plan"]:
            best = min((m for n, m in out.items() if n.startswith("uniform")), key=lambda m: m["kl"])
            t = best["kl_tokens"]
            swing = torch.ones_like(t)
            swing[:, ::2] = -1.0  # position by position +-the uniform's mean KL: noise far above a 1% lead
            tokens = t * 0.99 + swing * float(t.mean())
            out["plan"] = {**out["plan"], "kl": best["kl"] * 0.99, "kl_tokens": tokens}
        return out

    monkeypatch.setattr(validate, "measure", plan_barely_ahead)
    plan, out = _plan(capsys, sel.profile, tmp_path / "p.json")
    s = plan.solver.select
    lead = s["lead"]
    assert lead["plan"] == "plan" and lead["ratio"] == pytest.approx(0.99, abs=1e-4) and not lead["beyond_noise"]
    assert s["uniform_won"] and s["chosen"] == lead["uniform"]
    k, v = lead["uniform"].removeprefix("uniform ").split(" / ")
    assert {(p.k_scheme, p.v_scheme) for p in plan.layers} == {(k, v)}
    assert "select: plan measured 0.990x " in out and "within one standard error" in out
    assert f"the uniform configuration {k} / {v} measured within one standard error of the best plan" in out
    assert "within one standard error of the best plan, so the plan is that configuration" in plan.describe()


def test_validate_prices_a_plan_keeping_sinks_outside_the_profile(sel, tmp_path):
    """A plan the selection gave sinks and 32 recent tokens (schemes outside the menus) is priced in validate's plan
    row as the selection priced it, at each length; a uniform row of the same layers is not (NaN)."""
    import dataclasses
    import math

    from sensprof.planning.uniforms import keep_recent

    load_plan_candidates(sel.profile, tmp_path)
    plan = load_plan(str(tmp_path / "raw.json"))
    kept = plan.replace(layers=tuple(dataclasses.replace(p, k_scheme=keep_recent(p.k_scheme),
                                                         v_scheme=keep_recent(p.v_scheme)) for p in plan.layers))
    assert kept.layers != plan.layers
    profile = load_profile(sel.profile)
    fake = {name: {"kl": 0.5, "kl_std": 0.0, "dnll": 0.1, "dppl": 0.2} for name in ("plan", "uniform same")}
    for n in (32, 128):
        at = priced_at(profile.table, "streaming", 32, n)
        df = validation_table(kept, fake, {"plan": kept.layers, "uniform same": kept.layers}, profile.table, n,
                              profile.meta).set_index("config")
        assert df.loc["plan", "per_layer_sum"] == pytest.approx(predicted_damage(at, plan.layers))
        assert df.loc["plan", "predicted_kl"] > 0
        assert math.isnan(df.loc["uniform same", "predicted_kl"])
    # a uniform setting the selection chose reads measured cells only, as its joint factor was measured against
    won = kept.replace(solver=dataclasses.replace(kept.solver, select={"uniform_won": True, "candidates": []}))
    df = validation_table(won, fake, {"plan": won.layers}, profile.table, 128, profile.meta).set_index("config")
    assert math.isnan(df.loc["plan", "per_layer_sum"])


def test_keys_move_before_rope_only_on_layers_with_rope():
    """A NoPE layer (SmolLM3's every 4th) keeps its keys after RoPE; the damage read for a moved key is its own cell
    where the profile has one, else its twin's after RoPE."""
    import dataclasses

    from sensprof.artifacts import LayerPlan, Plan
    from sensprof.planning.selection import _keys_before_rope

    layers = [LayerPlan(i, "full", None, 2, 32, k, "int4_t32", 0.0, 0.0, {})
              for i, k in enumerate(("int4_c32", "int4_c32", "int2_c32_r32_s4", "int8_per_token_head"))]
    plan = Plan.hand_made("tiny", "fp", layers)
    cells = {(0, "K", "int4_c32"): 1.0, (1, "K", "int4_c32"): 2.0, (1, "K", "int4_c32_pre"): 0.5,
             (2, "K", "int2_c32"): 3.0, (3, "V", "int4_t32"): 0.25}
    problem = types.SimpleNamespace(damage=cells)
    moved = _keys_before_rope(plan, problem, [True, True, False, True])
    assert [p.k_scheme for p in moved.layers] == ["int4_c32_pre", "int4_c32_pre", "int2_c32_r32_s4",
                                                  "int8_per_token_head"]
    # every cell read again in the problem's unit (KL), kept keys and values too; a cell it lacks keeps the plan's
    assert [p.k_damage for p in moved.layers] == [1.0, 0.5, 3.0, 0.0]
    assert [p.v_damage for p in moved.layers] == [0.0, 0.0, 0.0, 0.25]
    assert [p.v_scheme for p in moved.layers] == [p.v_scheme for p in plan.layers]
    assert moved.predicted.damage == pytest.approx(4.75)
    nothing = plan.replace(layers=tuple(dataclasses.replace(p, k_scheme="none") for p in plan.layers))
    assert _keys_before_rope(nothing, problem, [True] * 4) is None
