"""validate --engine without an engine: which runs a plan becomes, the agreement figures, and every refusal as one
line (engines missing, a plan for another platform or target, a model llama.cpp cannot load, an engine crash)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys

import pytest
import torch

from conftest import make_tiny_model, one_error_line, run_cli
from sensprof.artifacts import LlamacppSettings, Plan, VllmSettings
from sensprof.engines.run.process import failure_reason, last_error, run_job
from sensprof.validation.validate_engine import expected_corr
from sensprof.engines.run.python import find_engine_python
from sensprof.errors import SensprofError
from sensprof.models import fingerprint
from sensprof.validation.validate_engine import (FALSE_ALARM, TokenDamage, agreement, family_z, gguf_path, llamacpp_run,
                                      vllm_run)
from test_evaluate import _plan


@pytest.fixture(scope="module")
def model():
    return make_tiny_model("llama")


def vllm_plan(model, gpu="cpu", dtype="fp8", scheme="fp8_e4m3_rtz", skip=(), needs_scales=False) -> Plan:
    plan = _plan(model, [("none", "none") if i in skip else (scheme, scheme) for i in range(2)])
    return plan.replace(target="vllm", engine=VllmSettings(needs_scales=needs_scales, kv_cache_dtype=dtype,
                                                           k_scheme=scheme, v_scheme=scheme, skip_layers=tuple(skip),
                                                           vllm_gpu=gpu))


def test_vllm_run_is_the_exported_configuration(model):
    run = vllm_run(vllm_plan(model, skip=(1,), needs_scales=True, scheme="fp8_e4m3_cal_rtz"), "cpu")
    assert run.settings == {"kv_cache_dtype": "fp8", "skip_layers": [1], "scaled": True}
    assert [p.k_scheme for p in run.layers] == ["fp8_e4m3_cal_rtz", "none"]


def test_a_plan_for_another_platform_is_refused_with_the_fix(model):
    with pytest.raises(SensprofError, match=r"made for Hopper .* runs on vLLM's CPU backend.*--vllm-gpu cpu"):
        vllm_run(vllm_plan(model, gpu="hopper", scheme="fp8_e4m3_qfp8"), "cpu")
    with pytest.raises(SensprofError, match="runs vLLM plans; this plan is for sensprof"):
        vllm_run(_plan(model, [("int4_c32", "int4_t32")] * 2), "cpu")
    with pytest.raises(SensprofError, match="runs llama.cpp plans; this plan is for vllm"):
        llamacpp_run(vllm_plan(model))
    plan = vllm_plan(model, dtype="int4_per_token_head", scheme="int4_per_token_head")
    with pytest.raises(SensprofError, match="does not run on vLLM's CPU backend"):
        vllm_run(plan, "cpu")


def test_llamacpp_run_and_a_model_without_gguf(model, tiny_model_dir):
    plan = _plan(model, [("q8_0", "q4_0")] * 2).replace(target="llamacpp", engine=LlamacppSettings(
        cache_type_k="q8_0", cache_type_v="q4_0"))
    assert llamacpp_run(plan).settings == {"type_k": "q8_0", "type_v": "q4_0"}
    with pytest.raises(SensprofError, match="llama.cpp loads GGUF files .* convert_hf_to_gguf.py"):
        gguf_path(tiny_model_dir)


def _damage(kl, dnll, base):
    return TokenDamage(*(torch.as_tensor(x, dtype=torch.float64) for x in (kl, dnll, base)))


def test_agreement_figures():
    g = torch.Generator().manual_seed(0)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.1
    noise = torch.randn(2, 400, generator=g, dtype=torch.float64) * 1e-3
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    same = agreement(_damage(d, d + noise, base), _damage(d * 1.05, d, base))
    assert same["kl_ratio"] == pytest.approx(1 / 1.05) and same["kl_agrees"] and same["dnll_agrees"]
    assert same["corr_applies"] and same["dnll_corr"] > 0.99 and same["agrees"]
    assert same["dnll_diff_se"] == pytest.approx(float(noise.std()) / (800 ** 0.5))
    # the ratio's own noise: the per-token KL difference's standard error over the predicted KL
    assert same["kl_ratio_se"] == pytest.approx(float((d - 1.05 * d).std()) / 800 ** 0.5 / float((1.05 * d).mean()))
    # the engine does 2x the damage: KL and dNLL both disagree
    off = agreement(_damage(2 * d, 2 * d + noise, base), _damage(d, d, base))
    assert not off["kl_agrees"] and not off["dnll_agrees"] and not off["agrees"]
    # numerically different baselines: the correlation is reported but not demanded
    far = agreement(_damage(d, d.flip(-1), base + 0.5), _damage(d, d, base))
    assert not far["corr_applies"] and far["corr_agrees"] and far["baseline_max_dlogp"] == pytest.approx(0.5)


def test_agreement_with_draws_of_the_engines_numerics():
    """llama.cpp: the engine's KL is held to the emulation in its numerics (the mean of several draws, whose spread
    joins the ratio's noise); its ΔNLL to the float32 emulation's plus the engine's floor's; the floor's KL is
    reported, not added; the raw ratio is over the float32 emulation."""
    g = torch.Generator().manual_seed(1)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.01
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    noise = torch.randn(2, 400, generator=g, dtype=torch.float64) * 1e-3
    shift = torch.randn(2, 400, generator=g, dtype=torch.float64) * 0.01 + 0.02  # the floor's own dNLL per token
    floor = _damage(0.8 * d, shift, base)
    eng = _damage(1.05 * d, d + shift + noise, base)
    m = float(d.mean())
    draws_kl, draws_dnll = (0.9 * m, 1.1 * m) * 4, (0.0, 0.002) * 4  # eight draws, as LLAMACPP_DRAWS
    drawn = dataclasses.replace(_damage(d, 3 * (d + shift), base), draws_kl=draws_kl, draws_dnll=draws_dnll,
                                float_kl=0.5 * m, float_dnll=d)
    row = agreement(eng, drawn, floor)
    assert row["kl_ratio"] == pytest.approx(1.05) and row["raw_kl_ratio"] == pytest.approx(2.1) and row["kl_agrees"]
    sd_kl, sd_dnll = (float(torch.tensor(x, dtype=torch.float64).std()) for x in (draws_kl, draws_dnll))
    assert row["numerics_draws"] == 8 and row["emulated_kl_draw_sd"] == pytest.approx(sd_kl)
    tokens_only = float((eng.kl - d).std()) / 800 ** 0.5
    assert row["kl_ratio_se"] == pytest.approx((tokens_only ** 2 + row["emulated_kl_draw_sd"] ** 2) ** 0.5 / m)
    assert row["engine_floor_kl"] == pytest.approx(0.8 * m) and row["emulated_kl"] == pytest.approx(m)  # not added
    # dNLL: the float32 emulation's plus the floor's (the numerics' own 3x is reported beside it)
    assert row["emulated_dnll"] == pytest.approx(m) and row["numerics_dnll"] == pytest.approx(3 * (m + float(shift.mean())))
    assert row["dnll_diff"] == pytest.approx(float(noise.mean())) and row["dnll_agrees"] and row["agrees"]
    assert row["dnll_diff_se"] == pytest.approx(float(noise.std()) / 800 ** 0.5)
    # the engine's run and its floor's are two draws of llama.cpp's numerics
    assert row["dnll_noise"] == pytest.approx((row["dnll_diff_se"] ** 2 + 2 * sd_dnll ** 2) ** 0.5)
    # without the floor's dNLL the engine's is far off
    assert not agreement(eng, drawn)["dnll_agrees"]
    # an emulation without draws (vLLM): compared as it is
    one = agreement(eng, _damage(d, d + shift, base))
    assert one["numerics_draws"] == 0 and one["float_emulated_kl"] == pytest.approx(m) and one["dnll_agrees"]
    assert one["numerics_dnll"] != one["numerics_dnll"]  # NaN: not drawn


def test_llamacpp_runs_include_the_engines_floor(model, monkeypatch):
    """A llama.cpp plan runs beside the baseline and the floor: the f32 cache through the one-chunk attention every
    quantized cache takes (a ubatch below ggml-cpu's 64-row tile)."""
    from sensprof.validation import validate_engine as ve

    monkeypatch.setattr(ve, "gguf_path", lambda model_id: "model.gguf")
    plan = _plan(model, [("q8_0", "q4_0")] * 2).replace(target="llamacpp", engine=LlamacppSettings(
        cache_type_k="q8_0", cache_type_v="q4_0"))
    runs = ve.check_engine_for_plan("llamacpp", plan, None)
    assert [r.name for r in runs] == ["engine baseline", "engine floor", "plan"]
    assert runs[1].floor and runs[1].plan is None and runs[1].settings == {"type_k": "f32", "type_v": "f32",
                                                                          "ubatch": 32}
    assert ve.FLOOR_UBATCH < 64


def test_engine_python_must_have_the_engine(tmp_path):
    with pytest.raises(SensprofError, match="--engine-python .* does not exist"):
        find_engine_python("vllm", str(tmp_path / "nope"))
    if not _has(sys.executable, "vllm"):
        with pytest.raises(SensprofError, match=f"--engine-python {sys.executable} cannot import vllm"):
            find_engine_python("vllm", sys.executable)
    with pytest.raises(SensprofError, match="unknown --engine 'tgi'; choose one of vllm, llamacpp"):
        find_engine_python("tgi")


def test_missing_engine_names_the_installer(tmp_path, monkeypatch):
    from sensprof.engines.run import python as p

    monkeypatch.setenv("SENSPROF_ENGINES", str(tmp_path))
    monkeypatch.delenv("SENSPROF_LLAMACPP_PYTHON", raising=False)
    monkeypatch.setattr(p.sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(SensprofError, match=r"llamacpp is not installed.*tools/engines/install.sh llamacpp"):
        find_engine_python("llamacpp")


def _has(python, module):
    import importlib.util

    return python == sys.executable and importlib.util.find_spec(module) is not None


def test_an_engine_crash_is_one_line_with_the_engines_own_error(tmp_path):
    """The runner fails inside the engine's Python (here: this Python, which has no vLLM): the line carries the
    engine's last exception, and its whole output is kept in the log the caller named."""
    if _has(sys.executable, "vllm"):
        pytest.skip("this Python has vLLM")
    log = tmp_path / "engine.log"
    job = {"windows": [[1, 2, 3]], "max_model_len": 4, "configs": [{"model": "m", "kv_cache_dtype": "auto",
                                                                   "out": str(tmp_path / "o.pt")}]}
    with pytest.raises(SensprofError, match=r"vllm failed: .*No module named 'vllm'.*its full log: .*engine.log") as e:
        run_job("vllm", sys.executable, job, str(tmp_path), str(log))
    assert "\n" not in str(e.value) and "Traceback" in log.read_text()


def test_a_killed_engine_is_said_to_be_killed_not_quoted_by_its_last_info_line():
    """A runner killed by a signal, whose output holds no error (vLLM's INFO lines came last), is reported as killed,
    without quoting an INFO line as the error; an error line or the runner's own error is still quoted."""
    info = "(MainProcess pid=1) INFO 12-03 18:00:00 [core.py:1] init engine (profile, create kv cache) took 2.23 s\n"
    assert failure_reason(info, [], -9) == "the process was killed by signal 9"
    assert failure_reason(info + "RuntimeError: out of memory\n", [], -9) == \
        "the process was killed by signal 9 after: RuntimeError: out of memory"
    assert failure_reason(info, ["ValueError: bad plan"], 1) == "ValueError: bad plan"
    assert failure_reason(info, [], 1) == info.strip()  # no error line: the last line, as before


def test_a_vllm_config_process_says_which_signal_ended_it():
    """A glibc heap abort (SIGABRT) is not the out-of-memory killer (SIGKILL); an exit code is neither."""
    import signal

    from sensprof.engines.run.vllm_runner import child_failure

    assert child_failure(signal.SIGABRT).startswith("the vLLM process was killed by SIGABRT (an abort inside vLLM")
    assert "out of memory" not in child_failure(signal.SIGABRT)
    assert child_failure(signal.SIGKILL) == "the vLLM process was killed by SIGKILL (out of memory?)"
    assert child_failure(3 << 8) == "the vLLM process exited with status 3"


def test_last_error_picks_the_exception_line():
    text = "INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad dtype\nbye\n"
    assert last_error(text) == "ValueError: bad dtype"
    assert last_error("") == "(no output)"
    # a warning that mentions an error after the real exception is not the error
    noisy = ("Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: cache too small\n"
             "WARNING 12-03 [logger.py] error reporting is disabled\n")
    assert last_error(noisy) == "RuntimeError: cache too small"
    assert last_error("INFO starting\nsomething error: disk full\nWARNING: errors ignored\n") == \
        "something error: disk full"


def test_cli_validate_engine_refusals_are_one_line(tmp_path, capsys, model):
    path = str(tmp_path / "plan.json")
    vllm_plan(model).save(path)
    line = one_error_line(*run_cli(capsys, "validate", path, "--engine", "tgi"))
    assert "unknown --engine 'tgi'" in line
    line = one_error_line(*run_cli(capsys, "validate", path, "--engine", "vllm", "--engine-python",
                                   str(tmp_path / "nowhere" / "python")))
    assert "--engine-python" in line and "does not exist" in line
    assert not os.path.exists(tmp_path / "plan.engine-vllm.csv")


def test_a_successful_engine_run_leaves_a_file_at_the_log_path_alone(tmp_path):
    """The log path sits beside the user's CSV: only a failure writes it, and success never removes or rewrites it."""
    log = tmp_path / "mine.log"
    log.write_text("the user's own notes")
    run_job("vllm", "/bin/true", {"configs": []}, str(tmp_path), str(log))  # an "engine" that succeeds at once
    assert log.read_text() == "the user's own notes"


def test_the_engines_temporary_files_go_in_the_work_folder(tmp_path):
    """vLLM leaves a file of its distributed store in the temporary folder of every run (/tmp/vllm_dist_*): the
    engine's TMPDIR is a folder inside the work folder, which the caller removes."""
    work, seen = tmp_path / "work", tmp_path / "seen"
    work.mkdir()
    engine = tmp_path / "python"  # an "engine" that says where its temporary files would go
    engine.write_text(f'#!/bin/sh\nprintf %s "$TMPDIR" > {seen}\n')
    engine.chmod(0o755)
    run_job("vllm", str(engine), {"configs": []}, str(work), str(tmp_path / "engine.log"))
    temp = seen.read_text()
    assert os.path.isdir(temp) and os.path.commonpath([temp, str(work)]) == str(work)


def test_engine_table_shows_the_ratio_with_its_noise():
    import pandas as pd

    from sensprof.validation.validate_engine import format_engine_table

    g = torch.Generator().manual_seed(2)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.01
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    drawn = dataclasses.replace(_damage(d, d, base), draws_kl=(0.009, 0.011), draws_dnll=(0.0, 0.001), float_kl=0.002,
                                float_dnll=d)
    row = agreement(_damage(1.1 * d, d, base), drawn, _damage(0.1 * d, 0 * d, base))
    lines = format_engine_table(pd.DataFrame([{"config": "plan", "predicted_kl": 0.01, **row}])).splitlines()
    assert "eng/emul ± SE" in lines[0] and "f32 KL" in lines[0] and "floor" in lines[0]
    assert f"{row['kl_ratio']:.2f} ± {row['kl_ratio_se']:.2f}" in lines[1] and "2.00e-03" in lines[1]
    assert "mean of 2 draws" in lines[2]
    plain = agreement(_damage(1.1 * d, d, base), _damage(d, d, base))  # vLLM: no numerics columns
    lines = format_engine_table(pd.DataFrame([{"config": "plan", "predicted_kl": 0.01, **plain}])).splitlines()
    assert "f32 KL" not in lines[0] and len(lines) == 3
    assert lines[2].startswith("agrees:") and "1 rows judged at once, 1% false alarms" in lines[2]


def test_the_noise_bounds_are_family_wise():
    """z grows with the rows judged at once (Bonferroni over three bounds a row at FALSE_ALARM): a difference of
    3 standard errors is a disagreement in one row alone, noise among seven."""
    from statistics import NormalDist

    from sensprof.validation.validate_engine import BOUNDS_PER_ROW

    assert BOUNDS_PER_ROW == 3  # KL, mean dNLL and the per-token correlation, each two-sided
    assert family_z(1) == pytest.approx(NormalDist().inv_cdf(1 - FALSE_ALARM / 6))
    assert family_z(1) < family_z(2) < family_z(7) < family_z(14) < 4
    g = torch.Generator().manual_seed(3)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.01
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    noise = torch.randn(2, 400, generator=g, dtype=torch.float64) * 1e-3
    noise = noise - noise.mean() + 3 * float(noise.std()) / 800 ** 0.5  # a mean difference of 3 SE exactly
    emu = _damage(d, d, base)
    assert not agreement(_damage(d, d + noise, base), emu)["dnll_agrees"]
    row = agreement(_damage(d, d + noise, base), emu, family=7)
    assert row["dnll_agrees"] and row["family"] == 7 and row["z"] == pytest.approx(family_z(7))


def test_the_emulations_draw_spread_joins_the_dnll_noise():
    """vLLM: the emulation is the mean of several draws of this machine's numerics; what one draw's mean dNLL moves
    from draw to draw (and so from machine to machine) widens the bound by (1 + 1/draws) of its variance, so a
    machine whose one draw lands elsewhere still agrees, while a difference beyond that spread does not."""
    g = torch.Generator().manual_seed(4)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.01
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    noise = torch.randn(2, 400, generator=g, dtype=torch.float64) * 1e-3
    eng = _damage(d, d + noise + 0.005, base)  # 0.005 off: ~70 paired SE, within the draws' spread below
    tight = agreement(eng, _damage(d, d, base))
    assert not tight["dnll_agrees"] and tight["emulation_draws"] == 0
    spread = (0.0, 0.004, 0.008, 0.004)
    drawn = dataclasses.replace(_damage(d, d, base), draws_kl=(float(d.mean()),) * 4, draws_dnll=spread)
    row = agreement(eng, drawn)
    sd = float(torch.tensor(spread).std())
    assert row["emulated_dnll_draw_sd"] == pytest.approx(sd) and row["emulation_draws"] == 4
    assert row["numerics_draws"] == 0  # not llama.cpp's numerics: the report's columns stay vLLM's
    assert row["dnll_noise"] == pytest.approx((row["dnll_diff_se"] ** 2 + 1.25 * sd ** 2) ** 0.5)
    assert row["dnll_agrees"] and row["agrees"]
    assert not agreement(_damage(d, d + noise + 0.05, base), drawn)["dnll_agrees"]  # ten times further: no


def test_the_kl_bound_is_its_tolerance_or_its_noise():
    """KL within 15%, or within z standard errors of the ratio where its noise is wider; twice the damage fails
    either way."""
    g = torch.Generator().manual_seed(5)
    d = torch.rand(2, 400, generator=g, dtype=torch.float64) * 0.01
    base = torch.rand(2, 400, generator=g, dtype=torch.float64)
    quiet = agreement(_damage(1.1 * d, d, base), _damage(d, d, base))
    assert quiet["kl_bound"] == pytest.approx(0.15) and quiet["kl_agrees"]
    noisy_kl = d * (1 + torch.randn(2, 400, generator=g, dtype=torch.float64) * 6)  # per-token KL all over the place
    noisy = agreement(_damage(noisy_kl.abs(), d, base), _damage(d, d, base))
    assert noisy["kl_bound"] == pytest.approx(noisy["z"] * noisy["kl_ratio_se"]) and noisy["kl_bound"] > 0.15
    assert not agreement(_damage(2 * d, d, base), _damage(d, d, base), family=14)["kl_agrees"]


def test_false_alarms_stay_below_the_family_rate_when_engine_and_emulation_agree():
    """Simulated checks of seven rows where the engine is one more draw of what the emulation averages (per-token
    noise and a draw-to-draw shift of the mean): the share of checks with any row out stays near FALSE_ALARM, while
    the old rule (2 SE of the paired difference alone) fails most of them."""
    g = torch.Generator().manual_seed(6)
    checks, rows, draws = 300, 7, 4
    new_alarms = old_alarms = 0
    for _ in range(checks):
        new_any = old_any = False
        for _ in range(rows):
            d = torch.rand(2, 200, generator=g, dtype=torch.float64) * 0.1
            base = torch.rand(2, 200, generator=g, dtype=torch.float64)
            shifts = torch.randn(draws + 1, generator=g, dtype=torch.float64) * 2e-3  # each draw's own mean shift
            tok = lambda: torch.randn(2, 200, generator=g, dtype=torch.float64) * 2e-3  # noqa: E731
            emu_draws = [d + tok() + shifts[i] for i in range(draws)]
            eng = _damage(d * (1 + 0.02 * torch.randn(1, generator=g).item()), d + tok() + shifts[draws], base)
            emu = dataclasses.replace(_damage(d, torch.stack(emu_draws).mean(0), base),
                                      draws_kl=tuple(float(d.mean()) for _ in range(draws)),
                                      draws_dnll=tuple(float(x.mean()) for x in emu_draws))
            row = agreement(eng, emu, family=rows)
            new_any |= not row["agrees"]
            old_any |= abs(row["dnll_diff"]) > 2 * row["dnll_diff_se"]
        new_alarms += new_any
        old_alarms += old_any
    print(f"false alarms: {new_alarms}/{checks} checks; the old rule {old_alarms}/{checks}")
    assert new_alarms / checks <= 3 * FALSE_ALARM
    assert old_alarms / checks > 0.5


def test_an_fp8_plan_on_a_cpu_without_avx512_is_refused_by_a_documented_switch(model, tmp_path):
    """The one place the engine checks depend on the CPU: vLLM's CPU backend stores fp8 only with AVX-512 or AMX;
    without, validate refuses in one line (and the engine tests skip with the same reason)."""
    from sensprof.engines.run.python import EnginePython
    from sensprof.validation.validate_engine import check_engine_for_plan, cpu_has_fp8

    def fake(avx512: int):
        py = tmp_path / f"python-{avx512}"
        py.write_text(f'#!/bin/sh\ncase "$2" in *avx512*) echo {avx512} ;; *) echo cpu ;; esac\n')
        py.chmod(0o755)
        return EnginePython("vllm", str(py), "0.32.0")

    assert cpu_has_fp8(fake(1)) and not cpu_has_fp8(fake(0))
    assert [r.name for r in check_engine_for_plan("vllm", vllm_plan(model), fake(1))] == ["engine baseline", "plan"]
    with pytest.raises(SensprofError, match="fp8 cache only on x86 with AVX-512 or AMX, which this CPU lacks"):
        check_engine_for_plan("vllm", vllm_plan(model), fake(0))


def _fake_engine(tmp_path, body: str):
    """An 'engine Python' that runs `body` with the runner's job (dict `job`) instead of a runner."""
    py = tmp_path / "fake-python"
    py.write_text(f"#!{sys.executable}\nimport json, sys\njob = json.load(open(sys.argv[2]))\n{body}\n")
    py.chmod(0o755)
    from sensprof.engines.run.python import EnginePython

    return EnginePython("llamacpp", str(py), "fake 0")


@pytest.mark.parametrize("body, message", [
    ("pass", "exited without writing its output llamacpp.json"),
    ("open(job['out'], 'wb').write(b'\\x00garbage')", "is not what its runner writes \\(UnicodeDecodeError|JSONDecode"),
    ("json.dump({'configs': {}}, open(job['out'], 'w'))", "lacks the figures of 'engine baseline'"),
])
def test_an_engine_output_that_is_missing_or_garbage_is_one_line(tmp_path, body, message):
    from sensprof.validation.validate_engine import LLAMACPP_BASELINE, run_llamacpp

    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SensprofError, match=message):
        run_llamacpp(_fake_engine(tmp_path, body), "m.gguf", [LLAMACPP_BASELINE], torch.zeros(1, 4, dtype=torch.long),
                     str(work), str(tmp_path / "engine.log"))


class _Payload:
    def __reduce__(self):
        return (open, (os.environ["SENSPROF_TEST_MARKER"], "w"))


def test_an_engine_output_can_never_run_code(tmp_path, monkeypatch):
    """vLLM's output is a torch file: read with weights_only, a pickle that would run code is refused unrun."""
    from sensprof.validation.validate_engine import read_engine_output

    marker = tmp_path / "ran"
    monkeypatch.setenv("SENSPROF_TEST_MARKER", str(marker))
    path = tmp_path / "run0.pt"
    torch.save({"hidden": torch.zeros(1, 2, 3), "evil": _Payload()}, path)
    with pytest.raises(SensprofError, match=r"run0.pt is not what its runner writes \(UnpicklingError\)"):
        read_engine_output("vllm", str(path))
    assert not marker.exists()
    torch.save({"hidden": torch.zeros(1, 2, 3), "layers": [{"name": "a", "k_scale": 1.0}], "vllm_version": "0"}, path)
    assert read_engine_output("vllm", str(path))["hidden"].shape == (1, 2, 3)


def test_engine_python_without_an_engine_and_a_wrong_env_python_are_one_line(capsys, tmp_path, monkeypatch):
    """--engine-python without --engine was ignored, and $SENSPROF_VLLM_PYTHON naming a missing interpreter was
    skipped for another without a word."""
    line = one_error_line(*run_cli(capsys, "validate", str(tmp_path / "p.json"), "--engine-python", sys.executable))
    assert "--engine-python names the Python that runs an engine, and no --engine was given" in line
    monkeypatch.setenv("SENSPROF_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(SensprofError, match=r"\$SENSPROF_VLLM_PYTHON names .*no-python, which does not exist"):
        find_engine_python("vllm")
    monkeypatch.setenv("SENSPROF_VLLM_PYTHON", sys.executable)  # a Python without vLLM
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(SensprofError, match=r"\$SENSPROF_VLLM_PYTHON names .* which cannot import vllm"):
            find_engine_python("vllm")


def test_a_per_layer_plan_is_judged_only_as_vllm_built_it(model):
    """validate --engine vllm of a per-layer plan passes it to sensprof's plugin (--additional-config) and refuses
    to judge it unless vLLM's own per-layer state says every layer got the plan's dtype (a vLLM without the plugin
    builds every layer with the global dtype)."""
    from sensprof.validation.engine_checks import vllm_cpu_mixed_run
    from sensprof.validation.validate_engine import check_served_dtypes

    run = vllm_cpu_mixed_run("tiny", model, skip=(1,))
    assert run.settings["additional_config"]["sensprof_plan"]["layers"] == ["fp8_e4m3", "auto", "fp8_e4m3"]
    check_served_dtypes(run, [{"kv_cache_dtype": d} for d in ("fp8_e4m3", "auto", "fp8_e4m3")])
    with pytest.raises(SensprofError, match="layer 1 with fp8_e4m3 where the plan says auto: install sensprof's vLLM "
                                            "plugin"):
        check_served_dtypes(run, [{"kv_cache_dtype": "fp8_e4m3"}] * 3)
    check_served_dtypes(vllm_run(vllm_plan(model), "cpu"), [])  # a one-dtype plan: nothing to check


def test_the_correlation_demanded_is_what_the_numerics_allow():
    """Per-token signal S, a draw's noise of variance v: the engine is one draw, the emulation the mean of 4. The
    correlation expected_corr predicts is the one such a pair shows; a strong signal is held to MIN_CORR, a weak one
    (small damage beside the noise) to what its noise allows, and an engine that follows another signal still fails."""
    import torch

    from sensprof.validation.validate_engine import CORR_SLACK, MIN_CORR, TokenDamage, agreement

    g = torch.Generator().manual_seed(0)
    n, draws = 4000, 4
    for signal_sd, noise_sd in ((1.0, 0.1), (0.1, 0.08)):
        s = torch.randn(n, generator=g) * signal_sd
        each = torch.stack([s + torch.randn(n, generator=g) * noise_sd for _ in range(draws)])
        engine = s + torch.randn(n, generator=g) * noise_sd
        emulated = each.mean(0)
        want = float(torch.corrcoef(torch.stack([engine, emulated]))[0, 1])
        got = expected_corr(emulated, each.var(0), draws)
        assert got == pytest.approx(want, abs=0.02)
        base = torch.zeros(1, n + 1)
        kl = torch.full((1, n), 0.01)
        emu = TokenDamage(kl, emulated.reshape(1, n), base, draws_kl=(0.01,) * draws,
                          draws_dnll=tuple(float(d.mean()) for d in each), draws_dnll_var=each.var(0).reshape(1, n))
        row = agreement(TokenDamage(kl, engine.reshape(1, n), base), emu)
        assert row["corr_applies"] and row["corr_agrees"]
        assert row["corr_floor"] == (MIN_CORR if signal_sd == 1.0 else pytest.approx(got - CORR_SLACK))
        other = torch.randn(n, generator=g) * signal_sd  # an engine whose per-token damage is another's
        assert not agreement(TokenDamage(kl, other.reshape(1, n), base), emu)["corr_agrees"]
    assert expected_corr(emulated, None, 1) != expected_corr(emulated, None, 1)  # NaN without draws


def test_an_agreeing_engine_on_few_tokens_fails_the_correlation_no_more_than_the_false_alarm_rate():
    """On 2 x 255 tokens (validate's 256-token windows) a correlation's own sampling error is about 0.04: held to
    what the numerics allow less a fixed 0.05, an engine that agrees failed about 2% of runs on the correlation
    alone (a planner's 8-bit per-layer plan did, 0.59 against 0.61); the floor now allows z sampling errors."""
    import torch

    from sensprof.validation.validate_engine import TokenDamage, agreement

    g = torch.Generator().manual_seed(1)
    n, draws, runs, failed = 510, 4, 1000, 0
    base, kl = torch.zeros(1, n + 1), torch.full((1, n), 0.01)
    for _ in range(runs):
        s = torch.randn(n, generator=g) * 0.1
        each = torch.stack([s + torch.randn(n, generator=g) * 0.1 for _ in range(draws)])
        emu = TokenDamage(kl, each.mean(0).reshape(1, n), base, draws_kl=(0.01,) * draws,
                          draws_dnll=tuple(float(d.mean()) for d in each), draws_dnll_var=each.var(0).reshape(1, n))
        row = agreement(TokenDamage(kl, (s + torch.randn(n, generator=g) * 0.1).reshape(1, n), base), emu, family=2)
        failed += not row["corr_agrees"]
        assert row["corr_floor"] < row["corr_allowed"] - 0.05  # more than the fixed slack at this length
    assert failed <= runs * 0.005, failed


def test_a_crashed_engine_is_reported_with_how_and_where_it_died(tmp_path):
    """A process that dies of SIGABRT with faulthandler on (as the runners run) leaves its innermost Python frame in
    the log, and glibc's own message where it printed one: the one-line failure names both, not only the signal."""
    import subprocess

    from sensprof.engines.run.process import crash_note

    script = tmp_path / "crash.py"
    script.write_text("import faulthandler, os, sys\nfaulthandler.enable()\n"
                      "def attend():\n    sys.stderr.write('corrupted size vs. prev_size\\n'); sys.stderr.flush()\n"
                      "    os.abort()\nattend()\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode < 0
    warning = "WARNING 12-07 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD.\n"  # no crash message
    text = warning + r.stderr
    assert crash_note(text) == "corrupted size vs. prev_size; in attend at " f"{script}:5"
    assert failure_reason(text, ["the vLLM process was killed by SIGABRT"], 1) == \
        f"the vLLM process was killed by SIGABRT (corrupted size vs. prev_size; in attend at {script}:5)"
    assert crash_note(warning) is None and failure_reason(warning, ["ValueError: bad plan"], 1) == "ValueError: bad plan"
