"""A per-layer plan served through sensprof's vLLM plugin on a real model, alone and under pressure: what
tests/engines/test_vllm_plugin.py checks on tiny models (every layer's dtype and backend as planned; the same greedy
tokens for a prompt alone, in a batch, with chunked prefill and after a preemption), on the model the plan is for.

    python benchmarks/vllm_plugin_pressure.py PLAN [PLAN ...] [--mixed] [--out results.json]

For each plan (made with `sensprof plan ... --target vllm --vllm-gpu cpu --per-layer`; with --mixed also a
hand-made plan cycling vLLM's own auto / fp8_e4m3 / fp8_e5m2 over the same model's layers), vLLM's CPU backend
(tools/engines/install.sh) serves a float32 checkpoint of the plan's model:
  roomy:    5 prompts (40, 7, 150, 60, 60 tokens of the built-in corpus), each alone and all in one call;
  pressure: the four prompts that fit its 128 tokens (40, 7, 60, 60) again, with 32-token blocks and prefill
            chunks (every prompt longer than a chunk is prefilled in pieces), in the smallest pool vLLM starts with
            (pressure_blocks: one request of 128 tokens), which the four together outgrow, so the scheduler preempts
            (counted, and required). Two requests in five blocks per group, the check before, forced it only where
            every group takes 32-token blocks: on Gemma 3 270M's hand-made plan vLLM gives the fp8 layers' groups
            128-token blocks (their pages are a quarter of the float32 auto layers') and nothing was preempted.
Verdicts: each prompt alone in the pressed engine (chunked prefill, small pages) gets the roomy engine's tokens, and
log-probabilities within 1e-4, or within what batching moves them in the roomy engine where that is more (ALONE_BOUND).
Together, log-probabilities move by vLLM's batch variance (float32 matmuls of other
shapes), which the roomy engine's own together-vs-alone difference measures (reported), so the tokens of a prompt in
a batch must equal its tokens alone up to a near tie (near_tie_flips: the greedy token ahead of the runner-up by
less than NEAR_TIE nats alone, nothing moved more before it); exact equality is reported beside. Gemma 3 270M's plan
of 8-bit keys and 6-bit values needed this: one 7-token prompt's fourth token led its runner-up by 0.0027 nats
alone, and the batch took the runner-up.
Prints one line per plan and writes everything the engines reported to --out (JSON)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
JOB = os.path.join(ROOT, "plugins", "vllm", "tests", "engine_job.py")
PROMPT_LENGTHS = (40, 7, 150, 60, 60)
PRESSURE = {"block_size": 32, "max_num_batched_tokens": 32, "enable_chunked_prefill": True, "max_model_len": 128}
MAX_TOKENS = 8
PRESSED = tuple(i for i, n in enumerate(PROMPT_LENGTHS) if n + MAX_TOKENS <= PRESSURE["max_model_len"])
MIXED_CYCLE = ("auto", "fp8_e4m3", "fp8_e5m2")
# Alone in the pressed engine a prompt's log-probabilities stay within 1e-4 of the roomy engine's on every plan measured
# on an AMD EPYC; on a 2-core Intel Xeon with AMX (2026-12-05) Gemma 3 270M's planned 8-bit keys / 6-bit values on
# SENSPROF_KV moved by 0.042 with chunked prefill (tokens equal; 0.0 with the same 32-token pages unchunked), where a
# batch moved them by 0.051 in the roomy engine. The cause is the model's float32 matmuls, not the plugin: there a
# linear layer of 2048 inputs (Gemma's MLP down-projection) gives other low bits for a 32-token chunk than for the
# whole 60-token prompt (8e-5 on random data; 0.0 for SmolLM2's 576 and 1536 inputs and for the plugin's attention),
# and a key or value that close to a rounding boundary of the cache's int8 / int6 codes flips. So the bound is the
# larger of 1e-4 and the roomy engine's own batch difference.
ALONE_BOUND = 1e-4
NEAR_TIE = 0.1  # nats: a greedy choice this close to the runner-up may flip under a batch's float32 noise (up to 0.065 seen)


def prompts(tokenizer) -> list[list[int]]:
    """Real text: consecutive pieces of the built-in corpus."""
    from sensprof.data import PYDOC_NAME, builtin_corpus

    ids = tokenizer(builtin_corpus(PYDOC_NAME)[:40_000], add_special_tokens=False)["input_ids"]
    out, at = [], 1000
    for n in PROMPT_LENGTHS:
        out.append(ids[at:at + n])
        at += n + 500
    return out


def pressure_blocks(groups: list[tuple[int, int | None]]) -> int:
    """num_gpu_blocks_override for the pressed engine: the fewest blocks vLLM starts with, for `groups` = [(block size,
    sliding window or None)] of its KV-cache groups. Its start-up check wants one request of max_model_len tokens:
    a block id in every group, ceil(max_model_len / block) of them in a full-attention group, one more in a
    sliding-window group (ceil(min(window - 1 + the prefill chunk, max_model_len) / block) + 1), and one block more
    that vLLM keeps back. Four requests together outgrow that; the minimum matters (on Gemma 3 270M's hand-made plan
    25 blocks, seven more, preempted nothing; 19 did)."""
    n, chunk = PRESSURE["max_model_len"], PRESSURE["max_num_batched_tokens"]
    return 1 + sum(math.ceil(n / b) if w is None else math.ceil(min(w - 1 + chunk, n) / b) + 1 for b, w in groups)


def check(name: str, layers: list[str], priced: float, roomy: dict, pressed: dict) -> dict:
    """What the tiny-model tests assert, as a verdict per item; `priced`: the KV bytes per token the export's
    arithmetic (budget.vllm_cpu_pool) gives the plan at the engine's float32."""
    errors = [f"{k}: {r['error']}" for k, r in (("roomy", roomy), ("pressure", pressed)) if "error" in r]
    if errors:
        return {"plan": name, "ok": False, "errors": errors}
    # a K/V pair runs on SENSPROF_KV with its two formats; vLLM's own dtypes on CPU_ATTN
    served = [f"k:{l['formats'][0]}/v:{l['formats'][1]}" if l["backend"] == "SENSPROF_KV" else l["kv_cache_dtype"]
              for l in roomy["layers"]]

    def most(xs, ys):
        return max(abs(a - b) for x, y in zip(xs, ys) for a, b in zip(x, y))

    want, want_logprobs = [roomy["alone"][i] for i in PRESSED], [roomy["alone_logprobs"][i] for i in PRESSED]
    want_margins = [roomy["alone_margins"][i] for i in PRESSED]
    alone = most(pressed["alone_logprobs"], want_logprobs)
    batch = most(roomy["together_logprobs"], roomy["alone_logprobs"])  # this engine's own batch variance
    batched = near_tie_flips(roomy["alone"], roomy["alone_logprobs"], roomy["alone_margins"], roomy["together"],
                             roomy["together_logprobs"])
    pressed_together = near_tie_flips(want, want_logprobs, want_margins, pressed["together"],
                                      pressed["together_logprobs"])
    verdict = {
        "plan": name, "layers_as_planned": served == layers,
        "backends": sorted({l["backend"] for l in roomy["layers"]}),
        "bytes_per_token": roomy["kv"]["bytes_per_token"], "priced_bytes_per_token": priced,
        "bytes_as_priced": roomy["kv"]["bytes_per_token"] == priced == pressed["kv"]["bytes_per_token"],
        "batched_equals_alone": roomy["alone"] == roomy["together"],
        "batched_same_up_to_near_ties": batched is not None,
        "batched_near_tie_flips": batched,
        "preemptions": pressed["preemptions"],
        "pressure_blocks": pressed["kv"]["num_blocks"],
        "pressure_alone_tokens_equal_roomy": pressed["alone"] == want,
        "pressure_tokens_equal_roomy": pressed["alone"] == pressed["together"] == want,
        "pressure_together_same_up_to_near_ties": pressed_together is not None,
        "pressure_together_near_tie_flips": pressed_together,
        "pressure_alone_logprob_diff": alone,
        "pressure_alone_bound": max(ALONE_BOUND, batch),
        "pressure_together_logprob_diff": most(pressed["together_logprobs"], want_logprobs),
        "roomy_batch_logprob_diff": batch,
        "start_s": [roomy.get("start_s"), pressed.get("start_s")],
    }
    verdict["ok"] = (verdict["layers_as_planned"] and verdict["bytes_as_priced"]
                     and verdict["batched_same_up_to_near_ties"] and verdict["preemptions"] >= 1
                     and verdict["pressure_alone_tokens_equal_roomy"]
                     and verdict["pressure_together_same_up_to_near_ties"]
                     and alone <= verdict["pressure_alone_bound"])
    return verdict


def near_tie_flips(tokens, logprobs, margins, other_tokens, other_logprobs) -> list[dict] | None:
    """Where greedy decoding in a batch left a prompt's tokens alone, each a near tie; None if any is not.

    A batch runs vLLM's float32 matmuls at other shapes, which moves log-probabilities (by up to 0.065 on these
    plans). Where the runner-up was closer than that, the batch may pick it, and every later token follows the other
    text. So a prompt passes when its tokens are equal, or equal up to a step where, alone, the greedy token led the
    runner-up by less than NEAR_TIE nats, every log-probability up to that step within NEAR_TIE of the alone run's
    (at the step itself: the two choices', equally likely). Returns the flips (prompt, step, margin)."""
    flips = []
    for p, (a, b, la, lb, m) in enumerate(zip(tokens, other_tokens, logprobs, other_logprobs, margins, strict=True)):
        step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if step is None:
            if len(a) != len(b):
                return None
            continue
        if m[step] is None or m[step] >= NEAR_TIE or any(abs(x - y) >= NEAR_TIE for x, y in zip(la[:step + 1],
                                                                                                  lb[:step + 1])):
            return None
        flips.append({"prompt": p, "step": step, "margin": m[step]})
    return flips


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


def serve_under_pressure(plan_paths: list[str], mixed: bool = False, log=print) -> dict:
    """Each plan (and with `mixed` a hand-made auto / fp8_e4m3 / fp8_e5m2 plan of its model) in a roomy and a pressed
    engine: {"verdicts": [check()'s, with the plan's `layers` and its float32 `priced_bytes_per_token`], "plans":
    every engine's report, "seconds": the engines' time}."""
    import torch

    from sensprof.artifacts import load_plan
    from sensprof.engines.run.python import find_engine_python
    from sensprof.export.checkpoint import write_checkpoint
    from sensprof.export.vllm import PLUGIN_KEY, plugin_plan, pool_layers
    from sensprof.models import load_for_plan
    from sensprof.planning.budget import vllm_cpu_pool

    torch.set_grad_enabled(False)
    python = find_engine_python("vllm").python
    report = {"plans": [], "verdicts": []}
    with tempfile.TemporaryDirectory(prefix="sensprof-pressure-") as work:
        roomy, named, windows_of = [], [], []  # per engine: {vLLM's layer name: sliding window}
        for i, path in enumerate(plan_paths):
            plan = load_plan(path)
            loaded = load_for_plan(plan, device="cpu", dtype="float32", quiet=True)
            ckpt = os.path.join(work, f"model{i}")
            write_checkpoint(plan, loaded.model, loaded.tokenizer, ckpt, dtype=torch.float32, scales=False)
            served = plugin_plan(plan)
            variants = [(os.path.basename(path), served)]
            if mixed:
                hand = dict(served, layers=[MIXED_CYCLE[j % 3] for j in range(len(plan.layers))])
                variants.append((f"{plan.model_id} hand-made auto/fp8_e4m3/fp8_e5m2", hand))
            ids = prompts(loaded.tokenizer)
            window = {f"model.layers.{q.layer}.self_attn.attn": q.window for q in plan.layers if q.kind == "sliding"}
            for name, p in variants:
                windows_of.append(window)
                roomy.append({"name": f"{name} roomy", "model": ckpt, "out": os.path.join(work, f"r{len(roomy)}.json"),
                              "additional_config": {PLUGIN_KEY: p}, "prompts": ids, "max_tokens": MAX_TOKENS})
                # what the export's arithmetic says vLLM allocates per token, at the float32 the engine serves
                pool = vllm_cpu_pool(pool_layers(plan, p["layers"]), itemsize=4)
                named.append((name, p["layers"], pool.bytes_per_token))
            del loaded
        t0 = time.time()
        roomy_results = run_job(python, roomy, work, "roomy")
        pressed = []
        for j, (c, r) in enumerate(zip(roomy, roomy_results)):  # a pool from the groups the roomy engine formed
            kv = r.get("kv") or {"group_block_sizes": [PRESSURE["block_size"]], "group_layers": [[]]}
            # vLLM scales a group's block by how much smaller its page is than the largest: the same ratios at 32
            sizes = [b * PRESSURE["block_size"] // min(kv["group_block_sizes"]) for b in kv["group_block_sizes"]]
            windows = [windows_of[j].get(names[0]) if names else None for names in kv["group_layers"]]
            pressed.append(dict(c, name=c["name"].replace(" roomy", " pressure"), out=os.path.join(work, f"p{j}.json"),
                                prompts=[c["prompts"][i] for i in PRESSED],
                                llm_args=dict(PRESSURE, num_gpu_blocks_override=pressure_blocks(list(zip(sizes, windows))))))
        pressed_results = run_job(python, pressed, work, "pressure")
        configs, results = roomy + pressed, roomy_results + pressed_results
        for j, (name, layers, priced) in enumerate(named):
            v = check(name, layers, priced, roomy_results[j], pressed_results[j]) | {"layers": layers}
            report["verdicts"].append(v)
            log(json.dumps({k: x for k, x in v.items() if k != "layers"}))
        report["plans"] = [{"config": {k: c[k] for k in ("name", "prompts", "max_tokens") if k in c},
                            "result": r} for c, r in zip(configs, results)]
        report["seconds"] = time.time() - t0
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--mixed", action="store_true", help="also a hand-made auto / fp8_e4m3 / fp8_e5m2 plan per model")
    ap.add_argument("--out", default=None, help="JSON of every engine report and verdict")
    args = ap.parse_args()
    report = serve_under_pressure(args.plans, args.mixed)
    print(f"{sum(v['ok'] for v in report['verdicts'])}/{len(report['verdicts'])} plans served as planned, "
          f"batch- and pressure-invariant, in {report['seconds']:.0f} s")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
