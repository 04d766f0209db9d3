"""generate_with_plan and `sensprof generate`: text through the planned cache, its bytes and speed."""

import os

import torch
from conftest import make_tiny_model, one_error_line, run_cli
from runtime.plans import make_plan

from sensprof.runtime.generate import generate_with_plan
from sensprof.runtime.kernels import cpu_kernels


def test_generate_greedy_sampling_and_left_padded_batch(tiny_tokenizer):
    model = make_tiny_model("llama")
    plan = make_plan(model, [("int8_per_token_head", "int8_per_token_head")] * 3, [{}] * 3)
    r = generate_with_plan(model, tiny_tokenizer, plan, ["The quick brown fox", "A"], max_new_tokens=6)
    assert len(r["texts"]) == 2 and r["tokens"] == 12 and r["cache_bytes"] > 0
    s = generate_with_plan(model, tiny_tokenizer, plan, ["The quick brown fox"], max_new_tokens=6, do_sample=True)
    assert s["tokens"] == 6


def test_generate_cli_prints_text_bytes_and_speed(tiny_model_dir, tmp_path, capsys):
    prof, plan = tmp_path / "p", tmp_path / "plan.json"
    assert run_cli(capsys, "profile", "--model", tiny_model_dir, "--seq-len", "32", "--windows", "2", "--schemes",
                   "int4_c32,int4_t32,int8_per_token_head", "--out", prof, "--device", "cpu", "--quiet")[0] == 0
    assert run_cli(capsys, "plan", prof, "--avg-bits", "8", "--out", plan)[0] == 0
    rc, out, err = run_cli(capsys, "generate", "--plan", plan, "--prompt", "The quick brown fox", "--prompt", "A",
                           "--max-new-tokens", "5", "--device", "cpu")
    assert rc == 0, err
    assert out.count("--- ") == 2 and "# cache:" in out and "tokens/s" in out and "2 sequences" in out
    used = "cpu" if cpu_kernels.available() is None else "reference"
    assert f"{used} kernels read the packed cache" in out
    line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--kernels", "fastest"))
    assert "unknown kernel preference 'fastest'" in line
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--kernels", "triton",
                                       "--device", "cpu"))
        assert "Triton kernels need" in line
    line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--max-new-tokens", "0"))
    assert "--max-new-tokens" in line
    if not torch.cuda.is_available():
        line = one_error_line(*run_cli(capsys, "generate", "--plan", plan, "--prompt", "x", "--device", "cuda"))
        assert "CUDA is not available" in line
