"""Whole-plan validation: every layer quantized at once, on windows the profile never saw, beside uniform
reference configurations; end to end through `sensprof profile / plan / validate` on a local tiny model."""

from __future__ import annotations

import math
import contextlib
import os
import types

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import VOCAB, make_tiny_model, one_error_line, run_cli

from sensprof.data import select_windows
from sensprof.cli import main
from sensprof.validation.validate import validation_windows
from sensprof.data import bos_prefix, builtin_corpus, tokenize
from sensprof.errors import SensprofError
from sensprof.models import describe_layers
from sensprof.artifacts import LayerPlan, load_plan
from sensprof.profiling.profile import run_profile
from sensprof.schemes import parse_schemes
from sensprof.validation.validate import (
    UNIFORM,
    layer_choices,
    measure,
    predicted_damage,
    reference_configs,
    validation_table,
)

NONE2 = ("none", "none")
PROFILE_SCHEMES = "fp8_e4m3,int8_per_token_head,int4_per_token_head,int2_c32,int2_t32"


# --------------------------------------------------------------------------- measure() on a tiny model


@pytest.fixture(scope="module")
def llama():
    model = make_tiny_model("llama")
    ids = torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    prof = run_profile(model, ids, parse_schemes("int8_per_token_head,int2_t32,fp8_e4m3_cal"), progress=False)
    return model, ids, prof


def config(model, prof, pairs) -> list[LayerPlan]:
    infos = describe_layers(model)
    if isinstance(pairs, tuple):
        pairs = [pairs] * len(infos)
    return [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0,
                      prof.calibration[str(i.index)]) for i, (k, v) in zip(infos, pairs)]


def test_unquantized_config_measures_zero(llama):
    model, ids, prof = llama
    m = measure(model, ids, {"none": config(model, prof, NONE2)})["none"]
    assert m["kl"] <= 1e-12
    assert abs(m["dnll"]) <= 1e-9 and abs(m["dppl"]) <= 1e-6
    assert m["base_ppl"] > 1


def test_quantized_configs_measure_positive_and_in_order(llama):
    model, ids, prof = llama
    res = measure(model, ids, {
        "int8": config(model, prof, ("int8_per_token_head", "int8_per_token_head")),
        "int2": config(model, prof, ("int2_c32", "int2_t32")),
        "int2 V on layer 0": config(model, prof, [("none", "int2_t32"), NONE2, NONE2]),
    })
    assert res["int8"]["kl"] > 0
    assert res["int2"]["kl"] > 10 * res["int8"]["kl"]
    assert res["int2"]["kl"] > res["int2 V on layer 0"]["kl"] > 0
    for m in res.values():
        assert set(m) >= {"kl", "kl_std", "dnll", "dppl", "base_ppl"}
        assert all(math.isfinite(v) for k, v in m.items() if k != "kl_per_window")
        assert m["dppl"] == pytest.approx(m["base_ppl"] * (math.exp(m["dnll"]) - 1), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("layer,tensor,scheme", [(1, "V", "int2_t32"), (0, "K", "int8_per_token_head"),
                                                 (2, "V", "fp8_e4m3_cal")])
def test_one_cell_config_measures_what_the_profile_measured(llama, layer, tensor, scheme):
    """The profiler replays from the quantized layer; validate runs whole forwards: the same number."""
    model, ids, prof = llama
    pairs = [NONE2] * 3
    pairs[layer] = (scheme, "none") if tensor == "K" else ("none", scheme)
    got = measure(model, ids, {"cell": config(model, prof, pairs)})["cell"]["kl"]
    t = prof.table
    want = float(t[(t.layer == layer) & (t.tensor == tensor) & (t.scheme == scheme)].kl.iloc[0])
    assert got == pytest.approx(want, rel=1e-3)


def test_calibrated_scheme_uses_the_layers_absmax(llama):
    model, ids, prof = llama
    pairs = [("fp8_e4m3_cal", "fp8_e4m3_cal")] * 3
    good = config(model, prof, pairs)
    bad = [LayerPlan(**{**p.__dict__, "absmax": {k: [x * 0.01 for x in v] for k, v in p.absmax.items()}})
           for p in good]
    res = measure(model, ids, {"good": good, "bad scales": bad})
    assert res["bad scales"]["kl"] > 10 * res["good"]["kl"]  # 1% of the absmax: most values saturate


def test_measure_leaves_the_model_unchanged(llama):
    model, ids, prof = llama
    with torch.inference_mode():
        before = model(input_ids=ids, use_cache=False).logits
    measure(model, ids, {"int2": config(model, prof, ("int2_c32", "int2_t32"))})
    with torch.inference_mode():
        after = model(input_ids=ids, use_cache=False).logits
    assert torch.equal(before, after)


def test_config_with_wrong_layer_count_is_refused(llama):
    model, ids, prof = llama
    with pytest.raises(SensprofError, match="has 2 layers, the model 3"):
        measure(model, ids, {"short": config(model, prof, NONE2)[:2]})


# --------------------------------------------------------------------------- end to end through the CLI


@pytest.fixture(scope="module")
def cli_run(tiny_model_dir, tmp_path_factory, _one_thread):
    root = tmp_path_factory.mktemp("validate")
    prof = root / "profile"
    assert main(["profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--schemes",
                 PROFILE_SCHEMES, "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    plan = root / "plan.json"
    # chosen by prediction alone: the table's predicted column is then the profile's per-layer sum
    assert main(["plan", str(prof), "--target", "sensprof", "--avg-bits", "6", "--select-measured", "0", "--out",
                 str(plan)]) == 0
    vplan = root / "vllm.json"
    # head_dim 32: int4_per_token_head is 5 bits; one layer at 16 bits -> 26/3 <= 10; fp8/int8 cannot skip one
    assert main(["plan", str(prof), "--target", "vllm", "--avg-bits", "10", "--num-skip", "1",
                 "--out", str(vplan)]) == 0
    return types.SimpleNamespace(root=root, profile=str(prof), plan=str(plan), vplan=str(vplan))


def test_validate_screens_baselines_within_the_plans_budget(cli_run, capsys, monkeypatch):
    """validate's uniform baselines may spend the budget the plan was made for, not only the plan's own cost, which
    falls short of it here (so a setting costing the budget itself is screened)."""
    from sensprof.validation import baselines

    path = str(cli_run.root / "budget.json")  # 5.9 bits, which no mix of the profile's schemes costs exactly
    assert main(["plan", cli_run.profile, "--avg-bits", "5.9", "--select-measured", "0", "--out", path]) == 0
    plan = load_plan(path)
    budget = plan.budget.limit(baselines.layer_info(plan.layers))
    assert baselines.plan_cost(plan) < budget
    limits, real = [], baselines.best_uniforms

    def recording(*args, limit=None, **kwargs):
        limits.append(limit)
        return real(*args, limit=limit, **kwargs)

    monkeypatch.setattr(baselines, "best_uniforms", recording)
    rc, _, err = run_cli(capsys, "validate", path, "--device", "cpu", "--seq-len", "32")
    assert rc == 0, err
    assert limits == [pytest.approx(budget)]


@pytest.mark.parametrize("lengths, screens", [("64,256", [128, 256]), ("32,64", [64])])
def test_validate_ranks_the_baselines_of_each_length_at_that_length(cli_run, capsys, monkeypatch, lengths, screens):
    """Which uniform setting wins moves with the length, so each length validate judges gets baselines screened at
    that length (at least SCREEN_TOKENS, within the longest); lengths that share a screen length screen once."""
    from sensprof.validation import baselines

    monkeypatch.setattr(baselines, "SCREEN_TOKENS", 128)  # 512 in use; the tiny model has 512 positions
    seen, real = [], baselines.best_uniforms

    def recording(model, ids, *args, **kwargs):
        seen.append(int(ids.shape[1]))
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(baselines, "best_uniforms", recording)
    out_csv = cli_run.root / f"lengths-{lengths.replace(',', '-')}.csv"
    rc, out, err = run_cli(capsys, "validate", cli_run.plan, "--device", "cpu", "--seq-len", lengths, "--windows",
                           "1", "--out", out_csv)
    assert rc == 0, err
    assert seen == screens
    assert out.count("baselines: screening") == len(screens)
    df = pd.read_csv(out_csv)
    for n in map(int, lengths.split(",")):  # every length judged against its own three
        assert (df[df.seq_len == n].config.str.startswith("best uniform ")).sum() == 3


def test_validate_cli_writes_the_table(cli_run, capsys):
    rc, out, err = run_cli(capsys, "validate", cli_run.plan, "--device", "cpu")
    assert rc == 0, err
    csv = cli_run.plan[:-len(".json")] + ".validation.csv"
    assert f"wrote {csv}" in out
    df = pd.read_csv(csv)
    assert list(df.columns) == ["config", "avg_bits", "bytes_per_token", "vs_bf16", "memory_vs_plan", "predicted_kl",
                                "per_layer_sum", "measured_kl", "kl_std", "dnll", "dppl", "measured_over_predicted", "seq_len"]
    plan = load_plan(cli_run.plan)
    own = plan.profile.settings["seq_len"]
    assert sorted(set(df.seq_len)) == [own, 4 * own]  # the profile's length and 4x it, by default
    assert f"unseen windows of {4 * own} tokens" in out
    assert len(df[df.seq_len == own]) == len(df[df.seq_len == 4 * own])
    full, df = df, df[df.seq_len == own]
    row = df[df.config == "plan"].iloc[0]
    assert row.memory_vs_plan == "plan"
    assert row.avg_bits == pytest.approx(plan.predicted.avg_bits)
    assert row.avg_bits <= 6 + 1e-9
    # predicted for the plan's reads at each validation length (sensprof.planning.pricing): at the profile's own length the
    # measured per-layer sum, at 4x it the sum scaled to the share of positions that read quantized tokens there
    from sensprof.planning.pricing import priced_at
    from sensprof.profiling.table import load_profile

    table = load_profile(cli_run.profile).table
    assert row.predicted_kl == pytest.approx(predicted_damage(table, plan.layers), rel=1e-9)
    longer = full[(full.seq_len == 4 * own) & (full.config == "plan")].iloc[0]
    assert longer.predicted_kl == pytest.approx(predicted_damage(priced_at(table, "streaming", own, 4 * own),
                                                                 plan.layers), rel=1e-9)
    assert row.measured_kl > 0 and math.isfinite(row.measured_kl)
    assert row.measured_over_predicted == pytest.approx(row.measured_kl / row.predicted_kl)
    refs = set(df.config) - {"plan"}
    assert "uniform KIVI-4 (int4_c32 / int4_t32)" in refs and "uniform fp8_e4m3" in refs
    # the best uniform configurations sensprof stores within the plan's budget (here all of it is the plan's memory),
    # menus or not (validation.baselines)
    best = [c for c in df.config if c.startswith("best uniform ")]
    assert len(best) == 3 and "baselines: screening" in out
    assert all(r.avg_bits <= row.avg_bits + 1e-9 for r in df[df.config.isin(best)].itertuples())
    kivi4 = df[df.config == "uniform KIVI-4 (int4_c32 / int4_t32)"].iloc[0]
    assert math.isnan(kivi4.predicted_kl)  # int4_c32 / int4_t32 were not profiled
    assert kivi4.measured_kl > 0
    for r in df[df.config != "plan"].itertuples():
        assert r.memory_vs_plan == (">=" if r.avg_bits >= row.avg_bits - 1e-9 else "<")
    kivi2 = df[df.config == "uniform KIVI-2 (int2_c32 / int2_t32)"].iloc[0]
    int8 = df[df.config == "uniform int8_per_token_head"].iloc[0]
    assert kivi2.measured_kl > int8.measured_kl
    assert kivi2.predicted_kl > 0 and math.isfinite(kivi2.predicted_kl)


def test_validate_cli_vllm_plan_has_the_skip_heuristic(cli_run, capsys, tmp_path):
    out_csv = tmp_path / "v.csv"
    rc, out, err = run_cli(capsys, "validate", cli_run.vplan, "--device", "cpu", "--out", out_csv)
    assert rc == 0, err
    df = pd.read_csv(out_csv)
    assert "vllm int4_per_token_head, skip first 1 layers (heuristic)" in set(df.config)
    assert "plan" in set(df.config)


def test_validation_windows_are_not_the_profiled_ones(cli_run, tiny_tokenizer):
    plan = load_plan(cli_run.plan)
    profiled, _, _, slots = select_windows(tiny_tokenizer, None, 32, 2, 0)
    assert list(plan.profile.window_slots) == list(slots)
    assert plan.profile.settings["seq_len"] == 32 and plan.profile.settings["windows"] == 2
    ids = validation_windows(plan, tiny_tokenizer, None, None)
    assert tuple(ids.shape) == (2, 32)
    seen = {tuple(r) for r in profiled.tolist()}
    assert not seen & {tuple(r) for r in ids.tolist()}
    more = validation_windows(plan, tiny_tokenizer, 5, None)
    assert tuple(more.shape) == (5, 32)
    assert not seen & {tuple(r) for r in more.tolist()}


def test_a_plan_profiled_on_the_older_prose_corpus_validates_on_that_prose(cli_run, tiny_tokenizer, tmp_path):
    """Plans made before the built-in corpus became a mixture recorded its prose by name: their unseen windows come
    from that prose, never from the mixture, and never the windows they were profiled on."""
    import json

    from sensprof.data import PYDOC_NAME, text_digest

    obj = json.loads(open(cli_run.plan).read())
    profiled, _, digest, slots = select_windows(tiny_tokenizer, None, 32, 2, 0, builtin=PYDOC_NAME)
    assert digest == text_digest(builtin_corpus(PYDOC_NAME)) != text_digest(builtin_corpus())
    obj["profile"]["settings"] |= {"text": PYDOC_NAME, "text_digest": digest}
    obj["profile"]["window_slots"] = list(slots)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(obj))
    plan = load_plan(str(path))
    ids = validation_windows(plan, tiny_tokenizer, 4, None)
    prose = tokenize(tiny_tokenizer, builtin_corpus(PYDOC_NAME))
    rows = {tuple(prose[k * 32:(k + 1) * 32]) for k in range(len(prose) // 32)}
    assert all(tuple(r) in rows for r in ids.tolist())  # every window is a slot of the prose
    assert not {tuple(r) for r in profiled.tolist()} & {tuple(r) for r in ids.tolist()}
    obj["profile"]["settings"]["text_digest"] = text_digest(builtin_corpus())  # prose named, mixture's digest
    path.write_text(json.dumps(obj))
    with pytest.raises(SensprofError, match="is not the text that was profiled"):
        validation_windows(load_plan(str(path)), tiny_tokenizer, 4, None)


@pytest.mark.parametrize("seq_len", [128, 20])
def test_validation_windows_of_another_length_share_no_token_with_the_profiled_ones(cli_run, tiny_tokenizer, seq_len):
    plan = load_plan(cli_run.plan)
    prefix = bos_prefix(tiny_tokenizer)
    tokens = tokenize(tiny_tokenizer, builtin_corpus())
    body = 32 - len(prefix)
    profiled = {i for s in plan.profile.window_slots for i in range(s * body, (s + 1) * body)}
    ids = validation_windows(plan, tiny_tokenizer, 6, seq_len)
    new_body = seq_len - len(prefix)
    for row in ids.tolist():
        body_ids = row[len(prefix):]
        starts = [k * new_body for k in range(len(tokens) // new_body) if tokens[k * new_body:(k + 1) * new_body] == body_ids]
        assert starts, "each window is an aligned slot of the text"
        assert not profiled & set(range(starts[0], starts[0] + new_body))


def test_validation_windows_take_exactly_the_free_slots(tmp_path, tiny_tokenizer):
    """A text with few slots: the profiled ones are excluded, so validation gets exactly the rest."""
    seq = 16
    body = seq - len(bos_prefix(tiny_tokenizer))
    text = builtin_corpus()[:3000]
    tokens = tokenize(tiny_tokenizer, text)
    n_slots = len(tokens) // body
    assert n_slots >= 5
    path = tmp_path / "text.txt"
    path.write_text(text)
    profiled, _, digest, slots = select_windows(tiny_tokenizer, [str(path)], seq, n_slots - 2, seed=0)
    plan = types.SimpleNamespace(profile=types.SimpleNamespace(
        settings={"seq_len": seq, "windows": n_slots - 2, "seed": 0, "text_digest": digest}, window_slots=slots,
        text_files=[str(path)]))
    ids = validation_windows(plan, tiny_tokenizer, 2, None)
    free = sorted(set(range(n_slots)) - set(slots))
    prefix = bos_prefix(tiny_tokenizer)
    assert ids.tolist() == [prefix + tokens[s * body:(s + 1) * body] for s in free]
    with pytest.raises(SensprofError, match="2 free windows"):
        validation_windows(plan, tiny_tokenizer, 3, None)
    # another --seq-len has other slot boundaries: every window overlapping a profiled one is left out, which here
    # (all but two slots profiled) leaves too few
    with pytest.raises(SensprofError, match="free windows of 20 tokens"):
        validation_windows(plan, tiny_tokenizer, 3, seq + 4)


@pytest.fixture(scope="module")
def text_run(tiny_model_dir, tmp_path_factory, _one_thread):
    """A profile of the tiny Llama on a text file, and a plan from it."""
    root = tmp_path_factory.mktemp("validate-text")
    text = root / "corpus.txt"
    text.write_text(builtin_corpus()[:60_000])
    prof, plan = root / "profile", root / "plan.json"
    assert main(["profile", "--model", tiny_model_dir, "--text", str(text), "--seq-len", "32", "--windows", "2",
                 "--schemes", "fp8_e4m3,int4_c32", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    with contextlib.chdir(root):  # the profile's text is read only from its folder or the current one
        assert main(["plan", str(prof), "--avg-bits", "8", "--out", str(plan)]) == 0
    return types.SimpleNamespace(root=root, text=text, profile=str(prof), plan=str(plan))


def _edited_plan(run, tmp_path, **profile_changes):
    import json

    obj = json.loads(open(run.plan).read())
    obj["profile"].update(profile_changes)
    obj["profile"]["path"] = os.path.abspath(run.profile)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(obj))
    return path


def test_validate_reads_only_the_text_the_plan_was_profiled_on(text_run, tmp_path, capsys):
    """profile.text_files edited to another file was read, and its "unseen windows" drawn from it."""
    rc, out, err = run_cli(capsys, "validate", text_run.plan, "--device", "cpu", "--seq-len", "32",
                           "--out", tmp_path / "ok.csv")
    assert rc == 0, err  # the plan as written validates
    other = tmp_path / "other.txt"
    other.write_text(text_run.text.read_text().replace("the", "teh"))
    for files, expect in (([str(other)], "is not the text that was profiled"),
                          ([str(tmp_path / "gone.txt")], "is not there"),
                          (None, "is not the text that was profiled")):  # the built-in corpus instead
        msg = one_error_line(*run_cli(capsys, "validate", _edited_plan(text_run, tmp_path, text_files=files),
                                      "--device", "cpu", "--out", tmp_path / "v.csv"))
        assert expect in msg and "re-profile and re-plan" in msg, msg
        assert not (tmp_path / "v.csv").exists()


def test_plan_beside_another_models_profile_does_not_predict_from_it(text_run, tmp_path, tiny_tokenizer, capsys,
                                                                    monkeypatch):
    """A plan copied next to another model's profile (its relative path now leads there) predicted from it."""
    import json
    import shutil

    monkeypatch.chdir(text_run.root)  # where the profile's text is: read from the current folder

    other = tmp_path / "other-model"
    make_tiny_model("llama", seed=1).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    assert main(["profile", "--model", str(other), "--text", str(text_run.text), "--seq-len", "32", "--windows", "2",
                 "--schemes", "fp8_e4m3,int4_c32", "--out", str(tmp_path / "profile"), "--device", "cpu",
                 "--quiet"]) == 0
    copied = tmp_path / "plan.json"
    shutil.copy(text_run.plan, copied)
    assert json.loads(copied.read_text())["profile"]["path"] == "profile"  # relative: now the other model's
    msg = one_error_line(*run_cli(capsys, "validate", copied, "--device", "cpu", "--seq-len", "32",
                                  "--out", tmp_path / "v.csv"))
    assert "is not the profile it was made from" in msg and "model fingerprint" in msg
    assert load_plan(text_run.plan).model_fingerprint in msg
    assert not (tmp_path / "v.csv").exists()


def test_validate_refuses_another_model(cli_run, tmp_path, tiny_tokenizer, capsys):
    other = tmp_path / "other"
    make_tiny_model("llama", seed=1).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    rc, out, err = run_cli(capsys, "validate", cli_run.plan, "--model", other, "--device", "cpu")
    line = one_error_line(rc, out, err)
    assert "fingerprint" in line and "--model" in line
    assert load_plan(cli_run.plan).model_fingerprint in line


def test_validate_refuses_a_bad_plan_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "sensprof-plan", "format_version": 99}')
    line = one_error_line(*run_cli(capsys, "validate", bad, "--device", "cpu"))
    assert "format version 99" in line


# --------------------------------------------------------------------------- reference configurations


def test_reference_configs_of_a_sensprof_plan(cli_run):
    plan = load_plan(cli_run.plan)
    refs = reference_configs(plan)
    n = len(plan.layers)
    kivi4 = refs["uniform KIVI-4 (int4_c32 / int4_t32)"]
    assert [(p.k_scheme, p.v_scheme) for p in kivi4] == [("int4_c32", "int4_t32")] * n
    assert [(p.k_scheme, p.v_scheme) for p in refs["uniform fp8_e4m3"]] == [("fp8_e4m3", "fp8_e4m3")] * n
    assert set(UNIFORM) <= set(refs)
    assert not any(name.startswith(("vllm", "sglang", "llama.cpp")) for name in refs)
    # each config keeps the plan's layer facts and calibration
    assert all(p.absmax == q.absmax and p.layer == q.layer for p, q in zip(kivi4, plan.layers))


def test_reference_configs_of_a_vllm_plan_with_skipped_layers(cli_run):
    plan = load_plan(cli_run.vplan)
    assert plan.engine.kv_cache_dtype == "int4_per_token_head"
    assert len(plan.engine.skip_layers) == 1
    refs = reference_configs(plan)
    heuristic = refs["vllm int4_per_token_head, skip first 1 layers (heuristic)"]
    assert [(p.k_scheme, p.v_scheme) for p in heuristic] == [NONE2] + [("int4_per_token_head",) * 2] * 2
    assert "vllm int4_per_token_head (int4_per_token_head), all layers" in refs
    # fp8_e4m3 (vLLM's flag) equals "uniform fp8_e4m3": shown once only
    choices = [tuple((p.k_scheme, p.v_scheme) for p in layers) for layers in refs.values()]
    assert len(choices) == len(set(choices))


def test_skip_heuristic_with_two_skipped_layers(cli_run):
    import dataclasses

    plan = load_plan(cli_run.vplan)
    s = plan.engine.k_scheme
    layers = layer_choices(plan, [NONE2, (s, s), NONE2])
    plan = dataclasses.replace(plan, layers=layers, engine=dataclasses.replace(plan.engine, skip_layers=(0, 2)))
    refs = reference_configs(plan)
    heuristic = refs[f"vllm {plan.engine.kv_cache_dtype}, skip first 2 layers (heuristic)"]
    assert [(p.k_scheme, p.v_scheme) for p in heuristic] == [NONE2, NONE2, (s, s)]


def test_reference_configs_of_a_llamacpp_plan(cli_run):
    import dataclasses

    plan = dataclasses.replace(load_plan(cli_run.plan), target="llamacpp",
                               engine={"cache_type_k": "q8_0", "cache_type_v": "q4_0"})
    refs = reference_configs(plan)
    assert [(p.k_scheme, p.v_scheme) for p in refs["llama.cpp -ctk q4_0 -ctv q4_0"]] == [("llamacpp_q4_0.K", "llamacpp_q4_0.V")] * 3
    assert "llama.cpp -ctk f16 -ctv f16" not in refs
    # every -ctk/-ctv pair a user could pick within the plan's memory, K and V apart; each type on both, whatever
    from sensprof.planning.plan import predicted_summary

    plan_bits = predicted_summary(plan.layers)["avg_bits"]
    types = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
    for k in types:
        for v in types:
            bits = predicted_summary(layer_choices(plan, (f"llamacpp_{k}.K", f"llamacpp_{v}.V")))["avg_bits"]
            assert (f"llama.cpp -ctk {k} -ctv {v}" in refs) is (k == v or bits <= plan_bits + 1e-9), (k, v)
    assert "llama.cpp -ctk q4_0 -ctv q5_0" in refs and "llama.cpp -ctk q8_0 -ctv q5_1" not in refs


def test_validation_table_predictions(cli_run):
    from sensprof.profiling.table import load_profile

    from sensprof.planning.pricing import priced_at

    plan = load_plan(cli_run.plan)
    table = load_profile(cli_run.profile).table
    pricing = plan.predicted.pricing  # the plan's damage: the profile's priced at the serving length
    assert pricing["reads"] == "streaming" and pricing["context_len"] == 512  # the tiny model's positions
    at = priced_at(table, "streaming", pricing["profile_len"], pricing["context_len"])
    assert predicted_damage(at, plan.layers) == pytest.approx(plan.predicted.damage, rel=1e-9)
    assert math.isnan(predicted_damage(table, layer_choices(plan, ("int4_c32", "int4_t32"))))
    assert math.isnan(predicted_damage(None, plan.layers))
    assert predicted_damage(table, layer_choices(plan, NONE2)) == 0.0
    configs = {"plan": plan.layers, "all none": layer_choices(plan, NONE2)}
    fake = {name: {"kl": 0.5, "kl_std": 0.0, "dnll": 0.1, "dppl": 0.2} for name in configs}
    df = validation_table(plan, fake, configs, table)
    row = df.set_index("config").loc["all none"]
    assert row.avg_bits == 16 and row.vs_bf16 == 1.0 and row.memory_vs_plan == ">="
    assert row.predicted_kl == 0.0 and math.isnan(row.measured_over_predicted)


def test_sweep_writes_the_frontier_and_validates_each_plan(cli_run, capsys, tmp_path):
    import pandas as pd

    out = tmp_path / "sweep"
    capsys.readouterr()
    assert main(["sweep", cli_run.profile, "--target", "sensprof", "--avg-bits", "2,4,6,16", "--validate",
                 "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--avg-bits 2: infeasible" in printed  # the cheapest profiled scheme costs 3 bits here
    df = pd.read_csv(out / "sweep.csv")
    assert list(df.budget_avg_bits) == [4.0, 6.0, 16.0]
    assert (df.avg_bits <= df.budget_avg_bits + 1e-9).all()
    assert df.predicted_damage.is_monotonic_decreasing and df.predicted_damage.iloc[-1] == 0.0
    assert df.frontier.all()
    assert (df.measured_kl.iloc[:-1] > 0).all() and df.measured_kl.iloc[-1] == pytest.approx(0.0, abs=1e-9)
    for path in df.plan:
        assert os.path.isfile(path)
    uniform = pd.read_csv(out / "uniform.csv")  # the best uniform settings sensprof stores, menus or not, per budget
    best = uniform[uniform.config.str.startswith("best uniform ")]
    assert len(best) >= 3 and "baselines: screening" in printed
    assert (best.avg_bits <= df.avg_bits.max() + 1e-9).all()
    assert not best.k_scheme.isin(PROFILE_SCHEMES.split(",")).all()  # not only what the profile measured


def test_sweep_refuses_a_malformed_budget_list(cli_run, capsys):
    line = one_error_line(*run_cli(capsys, "sweep", cli_run.profile, "--avg-bits", "4,lots"))
    assert "--avg-bits" in line and "comma-separated" in line


def test_advantage_that_vanishes_at_length_is_flagged():
    from sensprof.validation.validate import advantage_note

    def table(plan_kl_short, plan_kl_long):
        rows = []
        for n, plan_kl in ((256, plan_kl_short), (1024, plan_kl_long)):
            rows += [{"seq_len": n, "config": "plan", "memory_vs_plan": "plan", "measured_kl": plan_kl},
                     {"seq_len": n, "config": "uniform A", "memory_vs_plan": ">=", "measured_kl": 1.0},
                     {"seq_len": n, "config": "uniform B", "memory_vs_plan": "<", "measured_kl": 0.1}]
        return pd.DataFrame(rows)

    note = advantage_note(table(0.5, 1.2))
    assert note.startswith("warning:") and "1024 tokens" in note and "uniform A" in note and "1.20x" in note
    assert advantage_note(table(0.5, 0.9)) is None  # still ahead at the longer length
    assert advantage_note(table(1.5, 1.2)) is None  # never ahead: nothing vanished
    lossless = table(0.5, 0.9)  # a baseline whose residual window holds every token of a short window: KL 0
    lossless.loc[(lossless.seq_len == 1024) & (lossless.config == "uniform A"), "measured_kl"] = 0.0
    assert "inf" in advantage_note(lossless) and "1024 tokens" in advantage_note(lossless)


def test_validate_bad_seq_len(cli_run, capsys):
    rc, out, err = run_cli(capsys, "validate", cli_run.plan, "--seq-len", "100000")
    assert "beyond the model's 512 positions" in one_error_line(rc, out, err)
    rc, out, err = run_cli(capsys, "validate", cli_run.plan, "--seq-len", "64,x")
    assert "--seq-len '64,x' is not a number" in one_error_line(rc, out, err)


def test_validate_on_the_users_own_text(text_run, tmp_path, capsys):
    """validate --text FILE...: the plan judged on the user's text (plain or JSONL), the CSV says which; the
    profile's own text, text sharing a profile window, an empty, binary or too short file, or JSONL without a text
    field are one line each, before the model loads."""
    import json

    from sensprof.data import builtin_corpus

    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n".join(json.dumps({"text": builtin_corpus()[-40_000:][i:i + 2000]})
                              for i in range(0, 40_000, 2000)))
    out = tmp_path / "v.csv"
    rc, stdout, err = run_cli(capsys, "validate", text_run.plan, "--device", "cpu", "--seq-len", "32",
                              "--text", mine, "--out", out)
    assert rc == 0, err
    assert "measured on 2 windows of mine.jsonl of 32 tokens" in stdout
    df = pd.read_csv(out)
    assert set(df.text) == {"mine.jsonl"} and "plan" in set(df.config)
    # a different text gives different figures than the profile's unseen windows
    rc, _, err = run_cli(capsys, "validate", text_run.plan, "--device", "cpu", "--seq-len", "32", "--out",
                         tmp_path / "own.csv")
    assert rc == 0, err
    assert "text" not in pd.read_csv(tmp_path / "own.csv").columns
    assert not np.allclose(pd.read_csv(tmp_path / "own.csv").measured_kl, df.measured_kl)

    profiled_part = tmp_path / "part.txt"  # the profile's text with other text around it
    profiled_part.write_text("Some words of my own. " * 50 + text_run.text.read_text())
    empty, binary, short, bad_jsonl = (tmp_path / n for n in ("empty.txt", "bin.txt", "short.txt", "bad.jsonl"))
    empty.write_text("   \n")
    binary.write_bytes(b"text\x00\x01\x02 more")
    short.write_text("two words")
    bad_jsonl.write_text(json.dumps({"prompt": "x"}) + "\n")
    for path, expect in ((text_run.text, "is the text the plan was profiled on"),
                         (profiled_part, "holds 32 or more tokens in a row of the windows the plan was profiled on"),
                         (empty, "is empty"), (binary, "holds NUL bytes"), (short, "shorter than one window"),
                         (bad_jsonl, "has no string 'text' field")):
        line = one_error_line(*run_cli(capsys, "validate", text_run.plan, "--device", "cpu", "--seq-len", "32",
                                       "--text", path, "--out", tmp_path / "bad.csv"))
        assert expect in line, line
        assert not (tmp_path / "bad.csv").exists()


def _chat_model_dir(tiny_model_dir, tmp_path):
    """The tiny model with a simple Jinja chat template on its tokenizer (the tests' own tokenizer has none)."""
    import shutil

    from transformers import AutoTokenizer

    d = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, d)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(d)
    return tok, str(d)


def _text_folder(folder, body: str):
    """A folder of the user's text: a plain file, JSONL chats (in a subfolder), a hidden file and a binary one."""
    import json

    (folder / "chats").mkdir(parents=True)
    (folder / "notes.txt").write_text(body[:8000])
    (folder / "chats" / "talk.jsonl").write_text("\n".join(
        json.dumps({"messages": [{"role": "user", "content": body[i:i + 400]},
                                 {"role": "assistant", "content": body[i + 400:i + 800]}]})
        for i in range(8000, len(body) - 800, 800)))
    (folder / ".draft.txt").write_text("not read")
    (folder / "figure.png").write_bytes(b"\x89PNG\x00\x00")
    return [str(folder / "chats" / "talk.jsonl"), str(folder / "notes.txt")]  # sorted by path


def test_profile_and_validate_on_a_folder_of_chats(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """--text FOLDER reads every text file under it (hidden and binary ones skipped), JSONL chats rendered with the
    model's chat template: a profile records the files it read (and validate re-reads them, chats and all);
    validate's CSV names the user's text and its one digest; a chat file for a model without a chat template, or the
    profile's own chats as --text, are one line each."""
    from sensprof.data import load_text, text_digest
    from sensprof.profiling.table import load_meta

    monkeypatch.chdir(tmp_path)  # the profile's recorded text lies under the current folder
    tok, chat_model = _chat_model_dir(tiny_model_dir, tmp_path)
    corpus = builtin_corpus()
    prof, plan = tmp_path / "profile", tmp_path / "plan.json"  # profiled on a folder of chats
    theirs = tmp_path / "theirs"
    profiled = _text_folder(theirs, corpus[100_000:124_000])
    assert main(["profile", "--model", chat_model, "--text", str(theirs), "--seq-len", "32", "--windows", "2",
                 "--schemes", "fp8_e4m3,int4_c32", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    meta = load_meta(str(prof))
    assert meta["text_files"] == profiled
    assert meta["settings"]["text_digest"] == text_digest(load_text(profiled, tok)[0])
    assert main(["plan", str(prof), "--avg-bits", "8", "--select-measured", "0", "--out", str(plan)]) == 0
    rc, stdout, err = run_cli(capsys, "validate", plan, "--device", "cpu", "--out", tmp_path / "own.csv")
    assert rc == 0, err

    mine = tmp_path / "mine"
    files = _text_folder(mine, corpus[-24_000:])
    out = tmp_path / "v.csv"
    rc, stdout, err = run_cli(capsys, "validate", plan, "--device", "cpu", "--text", mine, "--out", out)
    assert rc == 0, err
    assert "text: mine, 2 file(s) read" in stdout and "measured on 2 windows of mine of 32 tokens" in stdout
    df = pd.read_csv(out)
    assert set(df.text) == {"mine"} and set(df.text_digest) == {text_digest(load_text(files, tok)[0])}
    assert "<|user|>" in load_text(files, tok)[0]

    line = one_error_line(*run_cli(capsys, "validate", plan, "--model", tiny_model_dir, "--device", "cpu",
                                   "--text", files[0], "--out", tmp_path / "bad.csv"))
    assert f"{files[0]}:1 is a chat ('messages'), but the model's tokenizer has no chat template" in line
    line = one_error_line(*run_cli(capsys, "validate", plan, "--device", "cpu", "--text", theirs,
                                   "--out", tmp_path / "bad.csv"))
    assert "--text theirs is the text the plan was profiled on" in line
    assert not (tmp_path / "bad.csv").exists()


def test_an_upper_bound_prices_kept_recent_tokens_the_profile_lacks():
    """--select-measured's "+ sinks and 32 recent tokens" candidates hold `_r32_s4` schemes a profile rarely
    measured: the plan's sum prices each such cell at its base scheme's (kept tokens only remove error), so a plan
    chosen so keeps a printed prediction that validate compares; a cell the profile has is its own, and the other
    rows of validate's table stay priced by measured cells alone (NaN without them)."""
    table = pd.DataFrame({"layer": [0, 0, 0, 1, 1], "tensor": ["K", "K", "V", "K", "V"],
                          "scheme": ["int4_c64", "int4_c64_r32_s4", "int4_t64", "int4_c64", "int4_t64"],
                          "kl": [1.0, 0.25, 2.0, 4.0, 8.0]})
    layers = [types.SimpleNamespace(k_scheme="int4_c64_r32_s4", v_scheme="int4_t64_r32_s4")] * 2
    assert math.isnan(predicted_damage(table, layers))
    assert predicted_damage(table, layers, upper_bound=True) == pytest.approx(0.25 + 2.0 + 4.0 + 8.0)
    layers = [types.SimpleNamespace(k_scheme="int4_c64_r32_s4", v_scheme="int3_t64_r32_s4")] * 2
    assert math.isnan(predicted_damage(table, layers, upper_bound=True))  # no cell of either scheme: no sum
