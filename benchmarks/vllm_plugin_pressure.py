"""A per-layer plan served through sensprof's vLLM plugin on a real model, alone and under pressure: what
tests/engines/test_vllm_plugin.py checks on tiny models (every layer's dtype and backend as planned; the same greedy
tokens for a prompt alone, in a batch, with chunked prefill and after a preemption), on the model the plan is for.

    python benchmarks/vllm_plugin_pressure.py PLAN [PLAN ...] [--mixed] [--out results.json]

For each plan (made with `sensprof plan ... --target vllm --vllm-gpu cpu --per-layer`; with --mixed also a
hand-made plan cycling vLLM's own auto / fp8_e4m3 / fp8_e5m2 over the same model's layers), vLLM's CPU backend
(tools/engines/install.sh) serves a float32 checkpoint of the plan's model:
  roomy:    5 prompts (40, 7, 150, 60, 60 tokens of the built-in corpus), each alone and all in one call;
  pressure: the two 60-token prompts again in an engine of five 32-token blocks per KV-cache group (vLLM keeps one
            block of the pool back, so four per group hold one request of the 128-token maximum; each group of a
            sliding-window model takes its own blocks: six groups on Gemma 3 270M) with 32-token prefill chunks, so
            every prefill is chunked and, together, the scheduler admits both and preempts one when the blocks run
            out (whether it does depends on the order it grows them in: the preemption count is reported). Fewer
            blocks do not force it: at four per group vLLM admits the second request only after the first ends.
Verdicts: tokens equal everywhere; each prompt's log-probabilities alone in the pressed engine (chunked prefill,
small pages) equal the roomy engine's within 1e-4. Together, log-probabilities move by vLLM's batch variance (float32
matmuls of other shapes), which the roomy engine's own together-vs-alone difference measures: reported, not gated.
Prints one line per plan and writes everything the engines reported to --out (JSON)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
JOB = os.path.join(ROOT, "plugins", "vllm", "tests", "engine_job.py")
PROMPT_LENGTHS = (40, 7, 150, 60, 60)
PRESSURE = {"block_size": 32, "num_gpu_blocks_override": 5, "max_num_batched_tokens": 32,
            "enable_chunked_prefill": True, "max_model_len": 128}
MIXED_CYCLE = ("auto", "fp8_e4m3", "fp8_e5m2")


def prompts(tokenizer) -> list[list[int]]:
    """Real text: consecutive pieces of the built-in corpus."""
    from sensprof.data import PYDOC_NAME, builtin_corpus

    ids = tokenizer(builtin_corpus(PYDOC_NAME)[:40_000], add_special_tokens=False)["input_ids"]
    out, at = [], 1000
    for n in PROMPT_LENGTHS:
        out.append(ids[at:at + n])
        at += n + 500
    return out


def check(name: str, layers: list[str], roomy: dict, pressed: dict) -> dict:
    """What the tiny-model tests assert, as a verdict per item."""
    errors = [f"{k}: {r['error']}" for k, r in (("roomy", roomy), ("pressure", pressed)) if "error" in r]
    if errors:
        return {"plan": name, "ok": False, "errors": errors}
    # a K/V pair runs on SENSPROF_KV with its two formats; vLLM's own dtypes on CPU_ATTN
    served = [f"k:{l['formats'][0]}/v:{l['formats'][1]}" if l["backend"] == "SENSPROF_KV" else l["kv_cache_dtype"]
              for l in roomy["layers"]]

    def most(xs, ys):
        return max(abs(a - b) for x, y in zip(xs, ys) for a, b in zip(x, y))

    alone = most(pressed["alone_logprobs"], roomy["alone_logprobs"][3:])
    verdict = {
        "plan": name, "layers_as_planned": served == layers,
        "backends": sorted({l["backend"] for l in roomy["layers"]}),
        "bytes_per_token": roomy["kv"]["bytes_per_token"],
        "batched_equals_alone": roomy["alone"] == roomy["together"],
        "preemptions": pressed["preemptions"],
        "pressure_tokens_equal_roomy": pressed["alone"] == pressed["together"] == roomy["alone"][3:],
        "pressure_alone_logprob_diff": alone,
        "pressure_together_logprob_diff": most(pressed["together_logprobs"], roomy["alone_logprobs"][3:]),
        "roomy_batch_logprob_diff": most(roomy["together_logprobs"], roomy["alone_logprobs"]),
        "start_s": [roomy.get("start_s"), pressed.get("start_s")],
    }
    verdict["ok"] = (verdict["layers_as_planned"] and verdict["batched_equals_alone"]
                     and verdict["preemptions"] >= 1 and verdict["pressure_tokens_equal_roomy"] and alone < 1e-4)
    return verdict


def run_job(python: str, configs: list[dict], work: str, tag: str) -> list[dict]:
    """Every configuration through plugins/vllm/tests/engine_job.py in vLLM's environment: their reports."""
    job, log = os.path.join(work, f"{tag}.json"), os.path.join(work, f"{tag}.log")
    with open(job, "w") as f:
        json.dump({"configs": configs}, f)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=work)
    with open(log, "w") as out:
        rc = subprocess.run([python, JOB, job], stdout=out, stderr=subprocess.STDOUT, env=env,
                            stdin=subprocess.DEVNULL, cwd=work).returncode
    if rc:
        sys.exit(f"the engine job failed (exit {rc}); its log ends:\n{open(log).read()[-3000:]}")
    results = []
    for c in configs:
        with open(c["out"]) as f:
            results.append(json.load(f))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--mixed", action="store_true", help="also a hand-made auto / fp8_e4m3 / fp8_e5m2 plan per model")
    ap.add_argument("--out", default=None, help="JSON of every engine report and verdict")
    args = ap.parse_args()

    import torch

    from sensprof.artifacts import load_plan
    from sensprof.engines.run.python import find_engine_python
    from sensprof.export.checkpoint import write_checkpoint
    from sensprof.export.vllm import PLUGIN_KEY, plugin_plan
    from sensprof.models import load_for_plan

    torch.set_grad_enabled(False)
    python = find_engine_python("vllm").python
    report = {"plans": [], "verdicts": []}
    with tempfile.TemporaryDirectory(prefix="sensprof-pressure-") as work:
        roomy, named = [], []
        for i, path in enumerate(args.plans):
            plan = load_plan(path)
            loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
            ckpt = os.path.join(work, f"model{i}")
            write_checkpoint(plan, loaded.model, loaded.tokenizer, ckpt, dtype=torch.float32, scales=False)
            served = plugin_plan(plan)
            variants = [(os.path.basename(path), served)]
            if args.mixed:
                mixed = dict(served, layers=[MIXED_CYCLE[j % 3] for j in range(len(plan.layers))])
                variants.append((f"{plan.model_id} hand-made auto/fp8_e4m3/fp8_e5m2", mixed))
            ids = prompts(loaded.tokenizer)
            for name, p in variants:
                roomy.append({"name": f"{name} roomy", "model": ckpt, "out": os.path.join(work, f"r{len(roomy)}.json"),
                              "additional_config": {PLUGIN_KEY: p}, "prompts": ids, "max_tokens": 8})
                named.append((name, p["layers"]))
            del loaded
        t0 = time.time()
        roomy_results = run_job(python, roomy, work, "roomy")
        pressed = []
        for j, (c, r) in enumerate(zip(roomy, roomy_results)):  # five blocks per KV-cache group the roomy engine formed
            groups = len(r.get("kv", {}).get("group_layers") or [0])
            args_ = dict(PRESSURE, num_gpu_blocks_override=PRESSURE["num_gpu_blocks_override"] * groups)
            pressed.append(dict(c, name=c["name"].replace(" roomy", " pressure"), out=os.path.join(work, f"p{j}.json"),
                                prompts=c["prompts"][3:], llm_args=args_))
        pressed_results = run_job(python, pressed, work, "pressure")
        configs, results = roomy + pressed, roomy_results + pressed_results
        for j, (name, layers) in enumerate(named):
            v = check(name, layers, roomy_results[j], pressed_results[j])
            report["verdicts"].append(v)
            print(json.dumps(v), flush=True)
        report["plans"] = [{"config": {k: c[k] for k in ("name", "prompts", "max_tokens") if k in c},
                            "result": r} for c, r in zip(configs, results)]
        report["seconds"] = time.time() - t0
    print(f"{sum(v['ok'] for v in report['verdicts'])}/{len(report['verdicts'])} plans served as planned, "
          f"batch- and pressure-invariant, in {report['seconds']:.0f} s")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
