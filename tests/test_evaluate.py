"""`sensprof eval`: the probe sequences, their scoring, running them through the runtime cache, the CLI."""

from __future__ import annotations

import dataclasses
import os

import pandas as pd
import pytest
import torch
from conftest import make_tiny_model, one_error_line, run_cli
from transformers import DynamicCache

from sensprof.data import PYDOC_NAME, bos_prefix, builtin_corpus, tokenize
from sensprof.errors import SensprofError
from sensprof.evaluate import eval_configs, evaluate, parse_depths, parse_lengths, score
from sensprof.evaluate.run import (
    BASELINE,
    PLAN,
    feed,
    planned_cache_factory,
    run_samples,
    tail_logits,
)
from sensprof.evaluate.tasks import (
    CUE_TOKENS,
    NEEDLE_TOKENS,
    passkey_key,
    passkey_sample,
    retrieval_sample,
)
from sensprof.models import describe_layers, fingerprint
from sensprof.artifacts import LayerPlan, Plan


def _plan(model, pairs) -> Plan:
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, {})
              for i, (k, v) in zip(describe_layers(model), pairs)]
    return Plan.hand_made("tiny", fingerprint(model), layers)


@pytest.fixture(scope="module")
def corpus(tiny_tokenizer):
    return tokenize(tiny_tokenizer, builtin_corpus(PYDOC_NAME))


@pytest.fixture(scope="module")
def model():
    return make_tiny_model("llama")


# --------------------------------------------------------------------------- parsing


def test_lengths_accept_k_suffixes_and_plain_counts():
    assert parse_lengths("1k,2048,4K") == [1024, 2048, 4096]
    assert parse_lengths(" 2k , 1k,2k") == [1024, 2048]
    assert parse_depths("0.9,0,1,0.5") == [0.0, 0.5, 0.9, 1.0]
    for bad in ("abc", "1m", "-5", "1.3", "", "0"):
        with pytest.raises(SensprofError, match="--lengths"):
            parse_lengths(bad)
    for bad in ("1.5", "-0.1", "x", ""):
        with pytest.raises(SensprofError, match="--depths"):
            parse_depths(bad)


# --------------------------------------------------------------------------- the task builders


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("length", [300, 512])
def test_retrieval_plants_the_needle_at_its_depth_and_repeats_it_at_the_end(corpus, depth, length):
    prefix = [1]
    s = retrieval_sample(corpus, length, depth, seed=3, prefix=prefix)
    ids = list(s.ids)
    assert len(ids) == length and ids[:1] == prefix
    needle = ids[s.needle_start:s.needle_start + NEEDLE_TOKENS]
    assert ids[-NEEDLE_TOKENS:] == needle  # the copy at the end is the planted needle
    assert abs(s.needle_start - depth * length) <= 64 + 1  # within one 64-token chunk of the asked depth
    assert s.tail_start == length - NEEDLE_TOKENS and s.answer_start == s.tail_start + CUE_TOKENS
    assert list(s.targets) == needle[CUE_TOKENS:]
    filler = ids[1:s.needle_start] + ids[s.needle_start + NEEDLE_TOKENS:length - NEEDLE_TOKENS]
    assert len(filler) == length - 1 - 2 * NEEDLE_TOKENS
    starts = [i for i in range(len(corpus) - len(filler) + 1) if corpus[i:i + 8] == filler[:8]]
    assert any(corpus[i:i + len(filler)] == filler for i in starts)  # the filler is contiguous corpus text


def test_retrieval_is_deterministic_for_a_seed_and_differs_across_seeds(corpus):
    a = retrieval_sample(corpus, 400, 0.5, seed=0, prefix=[1])
    assert a == retrieval_sample(corpus, 400, 0.5, seed=0, prefix=[1])
    b = retrieval_sample(corpus, 400, 0.5, seed=1, prefix=[1])
    assert a.ids != b.ids and a.ids[-NEEDLE_TOKENS:] != b.ids[-NEEDLE_TOKENS:]
    c = retrieval_sample(corpus, 400, 0.9, seed=0, prefix=[1])  # another depth: same needle, elsewhere
    assert c.ids[-NEEDLE_TOKENS:] == a.ids[-NEEDLE_TOKENS:] and c.needle_start > a.needle_start


def test_retrieval_refuses_a_length_too_short(corpus):
    with pytest.raises(SensprofError, match="too short for the retrieval task; use at least 81"):
        retrieval_sample(corpus, 80, 0.5, 0, [1])


def test_passkey_sample_hides_the_key_and_asks_for_it(corpus, tiny_tokenizer):
    prefix = bos_prefix(tiny_tokenizer)
    s = passkey_sample(corpus, tiny_tokenizer, 400, 0.25, seed=2, prefix=prefix)
    key = str(passkey_key(2))
    assert len(s.ids) == 400 and len(key) == 5
    text = tiny_tokenizer.decode(list(s.ids))
    assert text.count(f"The pass key is {key}. Remember it.") == 1
    assert text.endswith(f"What is the pass key? The pass key is {key}")
    assert tiny_tokenizer.decode(list(s.targets)) == f" {key}"
    assert abs(s.needle_start - 0.25 * 400) <= 64
    assert tiny_tokenizer.decode(list(s.ids[s.tail_start:s.answer_start])).startswith("\n\nWhat is the pass key?")
    assert passkey_key(2) != passkey_key(3)


# --------------------------------------------------------------------------- scoring


def test_score_is_teacher_forced_top1_accuracy_on_the_targets(corpus):
    s = retrieval_sample(corpus, 200, 0.5, 0, [1])
    tail = list(s.ids[s.tail_start:])  # 32 tokens; targets are tail[4:], predicted by positions 3..30
    logits = torch.zeros(len(tail), 400)
    right = [3, 4, 10, 20, 30]  # positions whose argmax is the next token
    for p in range(len(tail)):
        logits[p, tail[p + 1] if p in right else (tail[p + 1] + 1) % 400 if p + 1 < len(tail) else 0] = 5.0
    r = score(logits, s)
    assert r["scored"] == NEEDLE_TOKENS - CUE_TOKENS == 28
    assert r["accuracy"] == pytest.approx(len(right) / 28) and r["exact"] == 0.0
    for p in range(len(tail) - 1):
        logits[p] = 0
        logits[p, tail[p + 1]] = 1.0
    assert score(logits.unsqueeze(0), s) == {"accuracy": 1.0, "exact": 1.0, "scored": 28}
    with pytest.raises(ValueError):
        score(logits[:-1], s)


class InductionLM(torch.nn.Module):
    """A perfect in-context copier: after the last 3 tokens, predict what followed their latest earlier
    occurrence. It keeps its history in the cache object it is given, so it tests the chunked feeding
    and the alignment of the scored logits, not a network."""

    def __init__(self, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 1)
        self.vocab = vocab

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        hist = past_key_values
        out = torch.zeros(1, input_ids.shape[1], self.vocab)
        for j, t in enumerate(input_ids[0].tolist()):
            hist.append(t)
            n = len(hist)
            for i in range(n - 2, 2, -1):
                if hist[i - 3:i] == hist[n - 3:n]:
                    out[0, j, hist[i]] = 1.0
                    break
        if logits_to_keep:
            out = out[:, -logits_to_keep:]
        return type("Out", (), {"logits": out})()


@pytest.mark.parametrize("task", ["retrieval", "passkey"])
def test_a_perfect_copier_scores_one_through_chunked_feeding(corpus, tiny_tokenizer, task):
    lm = InductionLM(400)
    if task == "retrieval":
        samples = [retrieval_sample(corpus, 300, d, s, [1]) for d in (0.1, 0.9) for s in range(2)]
    else:
        samples = [passkey_sample(corpus, tiny_tokenizer, 300, d, s, [1]) for d in (0.1, 0.9) for s in range(2)]
    rows = run_samples(lm, samples, list, chunk=37)
    assert [r["exact"] for r in rows] == [1.0] * 4


# --------------------------------------------------------------------------- through the runtime cache


def test_baseline_through_planned_cache_equals_dynamic_cache_and_a_plain_forward(model, corpus):
    s = retrieval_sample(corpus, 300, 0.3, 0, [1])
    plan = _plan(model, [("none", "none")] * 3)
    planned = tail_logits(model, s, planned_cache_factory(plan, plan.layers, model)(), chunk=64)
    dynamic = tail_logits(model, s, DynamicCache(config=model.config), chunk=64)
    with torch.no_grad():
        plain = model(torch.tensor([s.ids]), use_cache=False).logits[:, s.tail_start:]
    assert planned.shape == (1, NEEDLE_TOKENS, 320)
    assert torch.allclose(planned, dynamic, atol=1e-5) and torch.allclose(planned, plain, atol=1e-5)
    assert score(planned[0], s) == score(dynamic[0], s) == score(plain[0], s)


def test_feeding_all_logits_in_chunks_equals_one_forward(model):
    ids = torch.randint(3, 300, (1, 150), generator=torch.Generator().manual_seed(0))
    plan = _plan(model, [("none", "none")] * 3)
    chunked = feed(model, ids, planned_cache_factory(plan, plan.layers, model)(), 40, all_logits=True)
    with torch.no_grad():
        assert torch.allclose(chunked, model(ids, use_cache=False).logits, atol=1e-5)


def test_8bit_plan_stays_close_to_baseline_and_2bit_does_not(model, tiny_tokenizer):
    base_plan = _plan(model, [("int8_per_token_head", "int8_per_token_head")] * 3)
    df = evaluate(model, tiny_tokenizer, base_plan, "retrieval", [256], [0.2, 0.8], 2, 64, "none")
    acc = df[df.depth == "all"].set_index("config")["mean"]
    assert abs(acc[PLAN] - acc[BASELINE]) <= 0.05
    samples = df.attrs["samples"]
    assert len(samples) == 2 * 2 * 2 and set(samples.config) == {BASELINE, PLAN}
    # and the predictions themselves: the 8-bit cache changes the logits a little, 2-bit KIVI much more
    corpus = tokenize(tiny_tokenizer, builtin_corpus(PYDOC_NAME))
    s = retrieval_sample(corpus, 256, 0.5, 0, bos_prefix(tiny_tokenizer))
    ref = tail_logits(model, s, DynamicCache(config=model.config), 64)
    errs, agree = {}, {}
    for pair in (("int8_per_token_head", "int8_per_token_head"), ("int2_c32", "int2_t32")):
        p = _plan(model, [pair] * 3)
        got = tail_logits(model, s, planned_cache_factory(p, p.layers, model)(), 64)
        errs[pair[0]] = float((got - ref).abs().max())
        agree[pair[0]] = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    assert 0 < errs["int8_per_token_head"] < errs["int2_c32"] / 20
    assert agree["int8_per_token_head"] >= 0.95


def test_uniform_references_closest_not_below_and_unstorable_skipped(model, monkeypatch):
    import sensprof.validation.validate as sv

    plan = _plan(model, [("int4_c32", "int4_t32"), ("int8_per_token_head", "int4_t32"), ("int4_c32", "int4_t32")])
    configs, kinds, notes = eval_configs(plan, model, "auto")  # plan 6.5 bits: fp8_e4m3 (8) is the closest above
    assert list(configs) == [BASELINE, PLAN, "uniform fp8_e4m3"] and kinds["uniform fp8_e4m3"] == "uniform"
    assert not notes
    assert list(eval_configs(plan, model, "none")[0]) == [BASELINE, PLAN]
    # calibrated scales the plan does not carry: the runtime cannot store them
    monkeypatch.setitem(sv.UNIFORM, "uniform calibrated fp8", ("fp8_e4m3_cal", "fp8_e4m3_cal"))
    configs, _, notes = eval_configs(plan, model, "all")
    assert "uniform KIVI-2 (int2_c32 / int2_t32)" in configs and "uniform calibrated fp8" not in configs
    assert len(notes) == 1 and notes[0].startswith("skipped uniform calibrated fp8") and "calibrated" in notes[0]
    high = _plan(model, [("none", "int8_per_token_head")] * 3)  # 12 bits: nothing above, the largest below
    configs, _, notes = eval_configs(high, model, "auto")
    assert list(configs)[2:] == ["uniform int8_per_token_head"] and "largest" in notes[-1]
    with pytest.raises(SensprofError, match="--uniform"):
        eval_configs(plan, model, "some")
    bad = _plan(model, [("fp8_e4m3_cal", "none")] * 3)
    with pytest.raises(SensprofError, match="cannot be run through the runtime cache"):
        eval_configs(bad, model)


def test_sliding_window_model_runs_through_the_planned_cache(tiny_tokenizer):
    gemma = make_tiny_model("gemma3")  # sliding windows of 8 tokens, shorter than a chunk
    plan = _plan(gemma, [("none", "none")] * 3)
    corpus = tokenize(tiny_tokenizer, builtin_corpus(PYDOC_NAME))
    s = retrieval_sample(corpus, 200, 0.5, 0, [1])
    planned = tail_logits(gemma, s, planned_cache_factory(plan, plan.layers, gemma)(), chunk=50)
    with torch.no_grad():
        plain = gemma(torch.tensor([s.ids]), use_cache=False).logits[:, s.tail_start:]
    assert torch.allclose(planned, plain, atol=1e-4)


# --------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def cli_plan(tiny_model_dir, tmp_path_factory):
    from sensprof.cli import main

    root = tmp_path_factory.mktemp("eval-plan")
    prof, plan = root / "p", root / "plan.json"
    assert main(["profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--schemes",
                 "int4_c32,int4_t32,int8_per_token_head", "--out", str(prof), "--device", "cpu", "--quiet"]) == 0
    assert main(["plan", str(prof), "--avg-bits", "6", "--out", str(plan)]) == 0
    return str(plan)


def test_eval_cli_prints_the_table_and_writes_the_csv(capsys, cli_plan, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(builtin_corpus(PYDOC_NAME)[:20000])
    rc, out, err = run_cli(capsys, "eval", "--plan", cli_plan, "--lengths", "128,256", "--depths", "0.2,0.8",
                           "--seeds", "2", "--chunk", "64", "--device", "cpu", "--text", text, "--seq-len", "96",
                           "--windows", "2")
    assert rc == 0, err
    default = os.path.splitext(cli_plan)[0] + ".eval-retrieval.csv"
    assert f"wrote {default}" in out and "d=0.2" in out and "perplexity on --text" in out
    assert "eval: plan:" in err  # progress lines
    df = pd.read_csv(default)
    assert list(df.columns) == ["config", "kind", "avg_bits", "task", "metric", "length", "depth", "n", "mean", "std",
                                "min", "max"]
    configs = list(dict.fromkeys(df.config))
    assert configs[:2] == [BASELINE, PLAN] and len(configs) == 3  # + the uniform config nearest the plan's memory
    acc = df[df.metric == "accuracy"]
    assert len(acc) == 3 * 2 * 3  # configs x lengths x (2 depths + "all")
    assert set(acc.depth) == {"0.2", "0.8", "all"} and set(acc.length) == {128, 256}
    assert (acc[acc.depth != "all"].n == 2).all() and (acc[acc.depth == "all"].n == 4).all()
    assert ((acc["min"] <= acc["mean"]) & (acc["mean"] <= acc["max"]) & acc["mean"].between(0, 1)).all()
    ppl = df[df.metric == "ppl"]
    assert len(ppl) == 3 and (ppl["mean"] > 1).all() and (ppl.length == 96).all()
    assert df[df.config == BASELINE].avg_bits.iloc[0] == 16.0
    # --out, passkey, no references
    out_csv = tmp_path / "pk.csv"
    rc, out, err = run_cli(capsys, "eval", "--plan", cli_plan, "--task", "passkey", "--lengths", "200", "--depths",
                           "0.5", "--seeds", "1", "--uniform", "none", "--device", "cpu", "--out", out_csv, "--quiet")
    assert rc == 0 and err == "" and "passkey: exact match" in out
    pk = pd.read_csv(out_csv)
    assert list(pk.metric.unique()) == ["exact"] and len(pk) == 2 * 2


@pytest.mark.parametrize("argv,expect", [
    (["--task", "bogus"], "unknown --task 'bogus'"),
    (["--lengths", "abc"], "--lengths: 'abc' is not a token count"),
    (["--lengths", "1k"], "beyond the model's 512 positions"),
    (["--lengths", "40"], "too short for the retrieval task"),
    (["--task", "passkey", "--lengths", "30"], "too short for the passkey task"),
    (["--depths", "1.5"], "outside [0, 1]"),
    (["--seeds", "0"], "--seeds 0 is too few"),
    (["--chunk", "0"], "--chunk 0 is too small"),
    (["--uniform", "most"], "--uniform 'most'"),
    (["--text", "/nonexistent/x.txt"], "does not exist"),
    (["--text", "README.md", "--seq-len", "600"], "beyond the model's 512 positions"),
])
def test_eval_bad_input_is_one_line(capsys, cli_plan, argv, expect):
    line = one_error_line(*run_cli(capsys, "eval", "--plan", cli_plan, "--device", "cpu", "--lengths", "128", *argv))
    assert expect in line


def test_eval_refuses_a_plan_for_another_model_and_a_missing_plan(capsys, cli_plan, tiny_tokenizer, tmp_path):
    other = tmp_path / "other"
    make_tiny_model("llama", seed=5).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    line = one_error_line(*run_cli(capsys, "eval", "--plan", cli_plan, "--model", other, "--device", "cpu"))
    assert "fingerprint" in line and "--model" in line
    line = one_error_line(*run_cli(capsys, "eval", "--plan", tmp_path / "nope.json"))
    assert "does not exist" in line


def test_plan_replace_keeps_the_plan_intact(model):
    """eval builds configurations with dataclasses.replace: the plan object itself is not modified."""
    plan = _plan(model, [("int4_c32", "int4_t32")] * 3)
    before = dataclasses.asdict(plan)
    eval_configs(plan, model, "all")
    assert dataclasses.asdict(plan) == before
