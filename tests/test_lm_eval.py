"""lm-evaluation-harness integration: the `sensprof` model type scores and generates through a fresh PlannedCache
per request, `sensprof eval --lm-eval-tasks` compares the plan with the baseline and uniform configurations, and
`sensprof-lm-eval` is lm-eval's command line with the model registered. Offline: small custom YAML tasks over
local JSONL files, on tiny random models (and the default model, marked slow)."""

from __future__ import annotations

import json
import logging
import os
import sys

import pandas as pd
import pytest
from conftest import make_tiny_model, one_error_line, run_cli
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from sensprof.artifacts import LayerPlan, Plan
from sensprof.errors import SensprofError
from sensprof.evaluate.lm_eval_cli import main as lm_eval_cli
from sensprof.evaluate.lm_eval_model import SensprofLM
from sensprof.evaluate.run import BASELINE, PLAN
from sensprof.models import describe_layers, fingerprint, load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MC = [("The capital of France is", [" Paris", " London", " Berlin", " Madrid"], 0),
      ("Water freezes at zero degrees", [" Celsius", " Kelvin", " Fahrenheit", " Rankine"], 0),
      ("The largest planet of the solar system is", [" Mercury", " Jupiter", " Mars", " Venus"], 1),
      ("Two plus two equals", [" three", " five", " four", " six"], 2)]
GEN = [("Q: What is the capital of France?\nA:", " Paris"), ("Q: What is two plus three?\nA:", " 5"),
       ("Q: Which colour is the sky on a clear day?\nA:", " Blue")]


def write_tasks(d) -> str:
    """Two lm-eval tasks in `d`: sp_mc (multiple choice, log-likelihoods) and sp_gen (generate_until)."""
    os.makedirs(d, exist_ok=True)
    mc, gen = os.path.join(d, "mc.jsonl"), os.path.join(d, "gen.jsonl")
    with open(mc, "w") as f:
        f.writelines(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in MC)
    with open(gen, "w") as f:
        f.writelines(json.dumps({"question": q, "answer": a}) + "\n" for q, a in GEN)
    common = "dataset_path: json\ntest_split: test\ntarget_delimiter: ''\n"
    with open(os.path.join(d, "sp_mc.yaml"), "w") as f:
        f.write(f"task: sp_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {mc}\n"
                "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
                "doc_to_target: answer\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
                "    higher_is_better: true\n")
    with open(os.path.join(d, "sp_gen.yaml"), "w") as f:
        f.write(f"task: sp_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {gen}\n"
                "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
                "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
                "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return str(d)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("lm-eval-tasks"))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing here may reach a hub: the tasks read local JSONL files."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def lm_eval_logging():
    """lm-eval's command line binds a log handler to this test's captured stderr; put its logger back after."""
    import logging

    import lm_eval.utils

    logger = logging.getLogger("lm_eval")
    state = (list(logger.handlers), logger.level, logger.propagate, lm_eval.utils._LOGGING_CONFIGURED)
    yield
    logger.handlers[:] = state[0]
    logger.level, logger.propagate, lm_eval.utils._LOGGING_CONFIGURED = state[1:]


@pytest.fixture(scope="module")
def model():
    return make_tiny_model("llama")


def _plan(model, pair, model_id="tiny") -> Plan:
    layers = [LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, *pair, 0.0, 0.0, {})
              for i in describe_layers(model)]
    return Plan.hand_made(model_id, fingerprint(model), layers)


def _requests(tokenizer) -> list[Instance]:
    """Log-likelihood requests, some with contexts longer than the 8-token prefill chunk, one with none."""
    from sensprof.data import PYDOC_NAME, builtin_corpus

    text = builtin_corpus(PYDOC_NAME)[:4000]
    pairs = [(q, c) for q, cs, _ in MC for c in cs[:2]]
    pairs += [(text[:600], text[600:700]), (text[1000:1100], " the"), ("", text[:200])]
    return [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]


def _lm(model, tokenizer, pair, **kw) -> SensprofLM:
    return SensprofLM(pretrained=model, tokenizer=tokenizer, plan=_plan(model, pair), device="cpu", **kw)


# --------------------------------------------------------------------------- the model type


def test_the_model_type_is_registered_with_lm_eval():
    assert get_model("sensprof") is SensprofLM and issubclass(SensprofLM, HFLM)


def test_an_unquantized_plan_reproduces_hflm_loglikelihoods(model, tiny_tokenizer):
    reqs = _requests(tiny_tokenizer)
    expected = HFLM(pretrained=model, tokenizer=tiny_tokenizer, batch_size=4).loglikelihood(reqs, disable_tqdm=True)
    lm = _lm(model, tiny_tokenizer, ("none", "none"), chunk=8)
    got = lm.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in expected]
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, expected)) < 1e-4
    assert max(abs(b) for b, _ in expected) > 10  # long continuations: a real sum, not a trivial one
    # every request ran through its own cache, which held the whole input: context + continuation but its last
    pairs = [([lm.prefix_token_id], lm.tok_encode(c)) if not q else lm._encode_pair(q, c) for q, c in
             (r.args for r in reqs)]
    assert lm.stats.caches == len(reqs) and lm.stats.tokens == sum(len(a) + len(b) - 1 for a, b in pairs)
    fp32 = sum(2 * i.kv_heads * i.head_dim * 4 for i in describe_layers(model))
    assert lm.stats.bytes_per_token() == fp32  # unquantized: K and V of every layer in float32


def test_a_2_bit_plan_changes_loglikelihoods_and_holds_far_fewer_bytes(model, tiny_tokenizer):
    reqs = _requests(tiny_tokenizer)
    none = _lm(model, tiny_tokenizer, ("none", "none"), chunk=8)
    low = _lm(model, tiny_tokenizer, ("int2_c32", "int2_t32"), chunk=8)
    a, b = none.loglikelihood(reqs, disable_tqdm=True), low.loglikelihood(reqs, disable_tqdm=True)
    diffs = [abs(x - y) for (x, _), (y, _) in zip(a, b)]
    assert max(diffs) > 0.05
    assert low.stats.caches == len(reqs) and low.stats.nbytes > 0
    assert low.stats.bytes_per_token() < none.stats.bytes_per_token() / 4


def test_rolling_loglikelihood_runs_through_the_cache(model, tiny_tokenizer):
    from sensprof.data import PYDOC_NAME, builtin_corpus

    reqs = [Instance("loglikelihood_rolling", {}, (builtin_corpus(PYDOC_NAME)[:3000],), 0)]
    expected = HFLM(pretrained=model, tokenizer=tiny_tokenizer, max_length=256).loglikelihood_rolling(
        reqs, disable_tqdm=True)
    lm = _lm(model, tiny_tokenizer, ("none", "none"), chunk=64, max_length=256)
    got = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    assert abs(got[0] - expected[0]) < 1e-3 * abs(expected[0])
    assert lm.stats.caches > 1  # several 256-token windows, each its own cache


def test_generation_through_the_cache(model, tiny_tokenizer):
    reqs = [Instance("generate_until", {}, (q, {"until": ["\n\n"], "max_gen_toks": 12, "do_sample": False}), i)
            for i, (q, _) in enumerate(GEN)]
    expected = HFLM(pretrained=model, tokenizer=tiny_tokenizer).generate_until(reqs, disable_tqdm=True)
    lm = _lm(model, tiny_tokenizer, ("none", "none"), chunk=4)
    assert lm.generate_until(reqs, disable_tqdm=True) == expected  # prefill in chunks, then decode: same text
    prompt_tokens = sum(len(lm.tok_encode(q)) for q, _ in GEN)
    assert lm.stats.caches == len(GEN) and lm.stats.tokens > prompt_tokens
    low = _lm(model, tiny_tokenizer, ("int2_c32", "int2_t32"), chunk=4)
    low.generate_until(reqs, disable_tqdm=True)
    assert low.stats.caches == len(GEN) and 0 < low.stats.bytes_per_token() < lm.stats.bytes_per_token() / 4


def _long_request(n: int, cont: int = 5):
    ids = [3 + i % 300 for i in range(n)]
    return ids[:-cont], ids[-cont:]


def test_loglikelihood_request_longer_than_the_models_positions_is_refused(model, tiny_tokenizer):
    """lm-eval cut such requests from the left silently (a pass key cut off: every configuration scored 0)."""
    lm = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"))
    assert lm.max_length == 512  # the tiny Llama's positions
    ctx, cont = _long_request(600)
    with pytest.raises(SensprofError, match="request of 599 tokens is longer than the 512 the model takes.*cut 87 "
                                            "tokens.*--lm-eval-truncate"):
        lm._loglikelihood_tokens([(None, ctx, cont)], disable_tqdm=True)
    assert lm.stats.caches == 0  # the long request ran nothing
    ctx, cont = _long_request(513)  # 512 tokens in, the last scored: fits
    assert len(lm._loglikelihood_tokens([(None, ctx, cont)], disable_tqdm=True)) == 1


def test_loglikelihood_request_cut_from_the_left_when_asked(model, tiny_tokenizer, caplog):
    ctx, cont = _long_request(600)
    cut = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"), truncate="left")
    with caplog.at_level(logging.WARNING, logger="sensprof.evaluate.lm_eval_model"):
        got = cut._loglikelihood_tokens([(None, ctx, cont)], disable_tqdm=True)
    assert "cut 87 tokens from the left of a 599-token lm-eval log-likelihood request" in caplog.text
    plain = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"))
    assert got == plain._loglikelihood_tokens([(None, ctx[87:], cont)], disable_tqdm=True)  # what was scored
    with pytest.raises(SensprofError, match="truncate='right' is not 'left'"):
        _lm(model, tiny_tokenizer, ("none", "none"), truncate="right")


def test_generation_request_longer_than_the_models_positions(model, tiny_tokenizer, caplog):
    from sensprof.data import PYDOC_NAME, builtin_corpus

    prompt = builtin_corpus(PYDOC_NAME)[:3000]
    assert len(tiny_tokenizer(prompt)["input_ids"]) > 512
    req = [Instance("generate_until", {}, (prompt, {"until": ["\n\n"], "max_gen_toks": 4, "do_sample": False}), 0)]
    lm = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"), chunk=128)
    with pytest.raises(SensprofError, match="generation \\(context plus the tokens to generate\\) request of .* "
                                            "longer than the 512"):
        lm.generate_until(req, disable_tqdm=True)
    cut = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"), chunk=128, truncate="left")
    with caplog.at_level(logging.WARNING, logger="sensprof.evaluate.lm_eval_model"):
        assert len(cut.generate_until(req, disable_tqdm=True)) == 1
    assert "tokens from the left of a" in caplog.text and "generation" in caplog.text


def test_custom_offline_tasks_run_through_lm_eval(model, tiny_tokenizer, tasks_dir):
    lm = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"))
    tm = TaskManager(include_path=tasks_dir, include_defaults=False)
    r = simple_evaluate(model=lm, tasks=["sp_mc", "sp_gen"], task_manager=tm,
                        log_samples=False)
    assert 0 <= r["results"]["sp_mc"]["acc,none"] <= 1 and r["results"]["sp_gen"]["exact_match,none"] == 0.0
    assert r["n-samples"]["sp_mc"]["effective"] == len(MC)
    assert lm.stats.caches == 4 * len(MC) + len(GEN)  # one cache per choice, one per generation


def test_the_builtin_corpus_tasks_run_offline(model, tiny_tokenizer, tmp_path, capsys):
    from sensprof.evaluate.lm_eval_tasks import main as write_tasks_cli

    # 400 characters: prompts the tiny Llama's 512 positions hold (600 were cut by lm-eval, the key with them)
    assert write_tasks_cli([str(tmp_path), "--docs", "3", "--chars", "400"]) == 0
    rows = [json.loads(ln) for ln in open(tmp_path / "sp_passkey.jsonl")]
    assert len(rows) == 3 and all(f"The pass key is {r['answer']}." in r["prompt"] for r in rows)
    assert [r["depth"] for r in rows] == [0.1, 0.5, 0.9]
    lm = _lm(model, tiny_tokenizer, ("int4_c32", "int4_t32"), chunk=64)
    r = simple_evaluate(model=lm, tasks=["sp_passkey", "sp_pydoc_ppl"], log_samples=False,
                        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False))
    assert r["results"]["sp_passkey"]["exact_match,key"] == 0.0  # a random model recalls no key
    assert r["results"]["sp_pydoc_ppl"]["word_perplexity,none"] > 1
    assert lm.stats.caches >= 6 and lm.stats.tokens > 6 * 100
    assert write_tasks_cli([str(tmp_path), "--docs", "0"]) == 2
    assert capsys.readouterr().err.count("error: --docs 0") == 1


def test_a_plan_for_another_model_is_refused(model, tiny_tokenizer):
    other = make_tiny_model("llama", seed=3)
    with pytest.raises(SensprofError, match="fingerprint"):
        SensprofLM(pretrained=other, tokenizer=tiny_tokenizer, plan=_plan(model, ("none", "none")))


# --------------------------------------------------------------------------- the command lines


@pytest.fixture(scope="module")
def dir_plan(tiny_model_dir, tmp_path_factory):
    """A 4-bit plan file for the tiny model directory."""
    loaded = load_model(tiny_model_dir, "cpu")
    path = str(tmp_path_factory.mktemp("lm-eval-plan") / "plan.json")
    _plan(loaded.model, ("int4_c32", "int4_t32"), model_id=tiny_model_dir).save(path)
    return path


def test_sensprof_eval_writes_one_comparison_table(capsys, dir_plan, tasks_dir, tmp_path):
    out = tmp_path / "cmp.csv"
    rc, stdout, err = run_cli(capsys, "eval", "--plan", dir_plan, "--lm-eval-tasks", "sp_mc,sp_gen",
                              "--lm-eval-include", tasks_dir, "--lm-eval-limit", "3", "--device", "cpu",
                              "--out", out)
    assert rc == 0, err
    df = pd.read_csv(out)
    assert list(df.columns) == ["config", "kind", "avg_bits", "cache_bytes_per_token", "task", "metric", "filter",
                                "value", "stderr", "samples", "seconds"]
    configs = list(dict.fromkeys(df.config))
    assert configs[:2] == [BASELINE, PLAN] and len(configs) >= 3
    assert set(df.kind) == {"baseline", "plan", "uniform"}
    assert set(zip(df.task, df.metric)) == {("sp_mc", "acc"), ("sp_gen", "exact_match")}
    assert (df.samples == 3).all() and df.value.between(0, 1).all()
    per = df.groupby("config", sort=False).first()
    assert per.loc[BASELINE, "avg_bits"] == 16.0
    assert per.loc[PLAN, "avg_bits"] == 5.0  # int4 codes + an fp16 scale and zero-point per 32
    # short prompts: keys wait in full precision for a whole group of 32, so the cache holds more than 5 bits
    assert per.loc[PLAN, "cache_bytes_per_token"] < per.loc[BASELINE, "cache_bytes_per_token"]
    uni = per[per.kind == "uniform"]
    assert (uni.avg_bits >= per.loc[PLAN, "avg_bits"] - 1e-9).all()  # the uniform configuration with as much memory
    lines = stdout.splitlines()
    assert lines[0].startswith("| configuration | kind | bits | cache bytes/token | sp_mc acc | sp_gen exact_match |")
    assert any(ln.startswith(f"| {PLAN} | plan | ") for ln in lines) and f"wrote {out}" in stdout
    assert "eval: plan: sp_mc, sp_gen in" in err


def test_sensprof_lm_eval_is_lm_evals_command_with_the_model(capsys, dir_plan, tasks_dir, tiny_model_dir,
                                                            lm_eval_logging):
    rc = lm_eval_cli(["--model", "sensprof", "--model_args", f"pretrained={tiny_model_dir},plan={dir_plan},chunk=16",
                      "--device", "cpu", "--tasks", "sp_mc", "--include_path", tasks_dir, "--limit", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "sensprof" in out and "|sp_mc" in out.replace(" ", "") and "acc" in out
    assert "Selected Tasks" in err and "not of type `str`" not in err  # lm-eval's log, without HFLM's loading noise


# --------------------------------------------------------------------------- bad input


def test_lm_eval_missing_names_the_extra(capsys, dir_plan, monkeypatch, lm_eval_logging):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    line = one_error_line(*run_cli(capsys, "eval", "--plan", dir_plan, "--lm-eval-tasks", "gsm8k"))
    assert "pip install 'sensprof[eval]'" in line
    assert lm_eval_cli(["--model", "sensprof", "--tasks", "gsm8k"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sensprof-lm-eval: error: ") and "sensprof[eval]" in err and "\n" not in err


@pytest.mark.parametrize("argv,expect", [
    (["--lm-eval-tasks", "sp_mc,gsm8kk"], "unknown lm-eval task 'gsm8kk'; did you mean gsm8k"),
    (["--lm-eval-tasks", " , "], "--lm-eval-tasks needs at least one task"),
    (["--lm-eval-tasks", ""], "--lm-eval-tasks needs at least one task"),  # ran the retrieval task instead
    (["--lm-eval-tasks", "sp_mc", "--lm-eval-limit", "0"], "--lm-eval-limit 0"),
    (["--lm-eval-tasks", "sp_mc", "--num-fewshot", "-1"], "--num-fewshot -1 is negative"),
    (["--lm-eval-tasks", "sp_mc", "--lm-eval-include", "/nonexistent/tasks"], "is not a directory"),
])
def test_sensprof_eval_bad_lm_eval_input_is_one_line(capsys, dir_plan, tasks_dir, argv, expect):
    include = [] if "--lm-eval-include" in argv else ["--lm-eval-include", tasks_dir]
    line = one_error_line(*run_cli(capsys, "eval", "--plan", dir_plan, "--device", "cpu", *include, *argv))
    assert expect in line
    if "unknown" in expect:
        assert "`lm-eval ls tasks` lists" in line


def test_sensprof_lm_eval_with_a_missing_plan_is_one_line(capsys, tasks_dir, tmp_path, lm_eval_logging):
    assert lm_eval_cli(["--model", "sensprof", "--model_args", f"plan={tmp_path / 'nope.json'}", "--tasks", "sp_mc",
                        "--include_path", tasks_dir]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("sensprof-lm-eval: error:")]
    assert len(lines) == 1 and "nope.json' does not exist" in lines[0]
    with pytest.raises(SensprofError, match="needs a plan: --model_args plan=PLAN.json"):
        SensprofLM(pretrained="smollm2-135m")


# --------------------------------------------------------------------------- the default model


@pytest.fixture(scope="module")
def smollm2():
    from sensprof.artifacts import load_plan
    from sensprof.evaluate.run import use_sdpa
    from sensprof.models import load_for_plan

    plan = load_plan(os.path.join(ROOT, "plans", "smollm2-135m-sensprof-5bits.json"))
    loaded = load_for_plan(plan, None, "cpu", quiet=True)
    use_sdpa(loaded.model)
    return plan, loaded


@pytest.mark.slow
def test_default_model_baseline_is_hflms_and_the_plan_moves_long_requests(smollm2):
    import dataclasses

    from sensprof.data import PYDOC_NAME, builtin_corpus

    plan, loaded = smollm2
    text = builtin_corpus(PYDOC_NAME)[20000:23000]
    reqs = _requests(loaded.tokenizer)[:4] + [Instance("loglikelihood", {}, (text[:2800], text[2800:]), 9)]
    expected = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer).loglikelihood(reqs, disable_tqdm=True)
    none = dataclasses.replace(plan, layers=[dataclasses.replace(p, k_scheme="none", v_scheme="none")
                                             for p in plan.layers])
    base = SensprofLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, plan=none)
    got = base.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in expected]
    assert max(abs(a - b) for (a, _), (b, _) in zip(got, expected)) < 1e-3
    planned = SensprofLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, plan=plan)
    moved = planned.loglikelihood(reqs[-1:], disable_tqdm=True)[0][0]
    assert abs(moved - got[-1][0]) > 1e-3  # 700 tokens: most of the context is quantized
    assert planned.stats.bytes_per_token() < base.stats.bytes_per_token() / 3


@pytest.mark.slow
def test_default_model_runs_custom_tasks_through_its_plan(smollm2, tasks_dir):
    plan, loaded = smollm2
    lm = SensprofLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, plan=plan)
    r = simple_evaluate(model=lm, tasks=["sp_mc", "sp_gen"], log_samples=True,
                        task_manager=TaskManager(include_path=tasks_dir, include_defaults=False))
    assert r["results"]["sp_mc"]["acc,none"] >= 0.5  # the 135M model knows most of these
    answers = [s["resps"][0][0] for s in r["samples"]["sp_gen"]]
    assert any("Paris" in a for a in answers), answers  # greedy text through the cache, not noise
    assert lm.stats.caches == 4 * len(MC) + len(GEN)


def test_sensprof_lm_eval_unknown_task_and_a_setting_given_twice_are_one_line(capsys, dir_plan, tasks_dir,
                                                                               tiny_model_dir, lm_eval_logging):
    """lm-eval's ValueError for an unknown task and the TypeError of a device given in --model_args and --device
    were tracebacks."""
    assert lm_eval_cli(["--model", "sensprof", "--model_args", f"plan={dir_plan}", "--tasks", "no_such_task",
                        "--include_path", tasks_dir]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("sensprof-lm-eval: error:")]
    assert "Traceback" not in err and len(lines) == 1 and "no_such_task" in lines[0], err
    assert lm_eval_cli(["--model", "sensprof", "--model_args", f"pretrained={tiny_model_dir},plan={dir_plan},"
                        "device=cpu", "--device", "cuda", "--tasks", "sp_mc", "--include_path", tasks_dir]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("sensprof-lm-eval: error:")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "device is given twice: device=cpu in --model_args and --device cuda; pass it once" in lines[0]
    assert lm_eval_cli(["--model", "sensprof", "--model_args", f"plan={dir_plan},chunkk=16", "--tasks", "sp_mc",
                        "--include_path", tasks_dir]) == 2
    err = capsys.readouterr().err
    assert "unknown --model_args chunkk for the sensprof model" in err and "Traceback" not in err
    # the same value both ways is no conflict
    assert lm_eval_cli(["--model", "sensprof", "--model_args", f"pretrained={tiny_model_dir},plan={dir_plan},"
                        "chunk=16,device=cpu", "--device", "cpu", "--tasks", "sp_mc", "--include_path", tasks_dir,
                        "--limit", "1"]) == 0


@pytest.mark.parametrize("flag", [["--lm-eval-truncate"], ["--lm-eval-limit", "5"], ["--num-fewshot", "1"]])
def test_lm_eval_options_without_lm_eval_tasks_are_refused(capsys, dir_plan, flag):
    line = one_error_line(*run_cli(capsys, "eval", "--plan", dir_plan, "--device", "cpu", *flag))
    assert f"{flag[0]} is for lm-eval tasks, and no --lm-eval-tasks was given" in line
