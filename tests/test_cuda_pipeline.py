"""profile -> plan -> validate -> generate on a CUDA device, as a user with a GPU runs them (marked gpu; skipped
without CUDA): the profile measured on the GPU is the CPU's, and the plan runs through the compiled kernels."""

import csv
import os

import pytest
import torch

from sensprof.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SCHEMES = "fp8_e4m3,int4_c32,int4_t32,int2_t32"
COMMON = ["--seq-len", "64", "--windows", "2", "--schemes", SCHEMES, "--dtype", "float32", "--quiet"]


def _cells(path):
    with open(os.path.join(path, "profile.csv")) as f:
        return {(r["layer"], r["tensor"], r["scheme"]): float(r["kl"]) for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def profiles(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda-pipeline")
    for device in ("cpu", "cuda"):
        assert main(["profile", "--model", tiny_model_dir, *COMMON, "--device", device,
                     "--out", str(root / device)]) == 0
    return root


def test_the_profile_measured_on_the_gpu_is_the_cpus(profiles):
    """fp32 on both (no TF32 in torch's matmuls by default): a code that flips at a rounding boundary moves a
    cell a little, not the table."""
    cpu, gpu = _cells(profiles / "cpu"), _cells(profiles / "cuda")
    assert cpu.keys() == gpu.keys() and len(cpu) == 3 * 2 * 4
    for key, want in cpu.items():
        assert gpu[key] == pytest.approx(want, rel=0.05, abs=1e-6), key


def test_a_plan_validates_and_generates_on_the_gpu(profiles, capsys):
    plan = str(profiles / "plan.json")
    assert main(["plan", str(profiles / "cuda"), "--avg-bits", "5", "--out", plan]) == 0
    out_csv = str(profiles / "v.csv")
    assert main(["validate", plan, "--device", "cuda", "--windows", "2", "--out", out_csv]) == 0
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    assert rows and all(float(r["kl"]) >= 0 for r in rows if r.get("kl"))
    capsys.readouterr()
    assert main(["generate", "--plan", plan, "--prompt", "def main():", "--max-new-tokens", "8",
                 "--device", "cuda"]) == 0
    assert capsys.readouterr().out.strip()
