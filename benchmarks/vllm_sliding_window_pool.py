"""A per-layer plan on a sliding-window model served by vLLM's CPU backend through sensprof's plugin: the KV memory
vLLM's own KV cache config allocates per token against the plan's arithmetic (budget.vllm_cpu_pool, which the planner
prices with), every layer's dtype and backend as the plan says, and the greedy tokens alone and batched.

    python benchmarks/vllm_sliding_window_pool.py MODEL LAYERS [--prompts 3] [--max-tokens 16]

MODEL: a model sensprof loads (e.g. gemma3-270m); it is served from a float32 checkpoint of the very weights sensprof
loads. LAYERS: the plan, one dtype per layer, comma-separated (auto, fp8_e4m3, fp8_e5m2 or k:<K>/v:<V>), e.g. for
Gemma 3 270M (5 windowed layers, then a full one) `$(python -c "print(','.join(['auto' if i%6==5 else
'fp8_e4m3' if i%2 else 'k:fp8_e4m3/v:fp8_e5m2' for i in range(18)]))")`. Needs vLLM's CPU environment with the
plugin (tools/engines/install.sh); runs plugins/vllm/tests/engine_job.py there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

import torch

from sensprof.engines.run.python import find_engine_python
from sensprof.export.checkpoint import write_checkpoint
from sensprof.models import describe_layers, load_model
from sensprof.planning.budget import vllm_cpu_pool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PLUGIN = os.path.join(ROOT, "plugins", "vllm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("layers")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    t0 = time.time()
    loaded = load_model(args.model, device="cpu", dtype="float32")
    info = describe_layers(loaded.model)
    dtypes = args.layers.split(",")
    if len(dtypes) != len(info):
        raise SystemExit(f"{len(dtypes)} dtypes for {len(info)} layers")
    shape = [(d, i.kv_heads, i.head_dim, i.window if i.kind == "sliding" else None) for d, i in zip(dtypes, info)]
    work = tempfile.mkdtemp(prefix="sensprof-swpool-")
    ckpt = os.path.join(work, "checkpoint")
    write_checkpoint(None, loaded.model, loaded.tokenizer, ckpt, dtype=torch.float32, scales=False)  # no KV scales
    arch = loaded.model.config.architectures[0] if loaded.model.config.architectures else type(loaded.model).__name__
    plan = {"format": "sensprof-vllm-plan", "version": 1, "layers": dtypes,
            "model": {"architecture": arch, "num_layers": len(dtypes), "num_kv_heads": info[0].kv_heads,
                      "head_dim": info[0].head_dim, "name": args.model}}
    g = torch.Generator().manual_seed(7)
    lengths = [700, 40, 300, 1000, 9][:args.prompts]  # past the window (512 on Gemma 3 270M), and short
    prompts = [torch.randint(1000, 20000, (n,), generator=g).tolist() for n in lengths]
    out = os.path.join(work, "out.json")
    job = os.path.join(work, "job.json")
    with open(job, "w") as f:
        json.dump({"configs": [{"name": "plan", "model": ckpt, "additional_config": {"sensprof_plan": plan},
                                "prompts": prompts, "max_tokens": args.max_tokens, "out": out,
                                "llm_args": {"max_model_len": 1100}}]}, f)
    # TMPDIR: vLLM's temporary files and the compile cache of its sampler's torch.compile go in work, removed below
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=PLUGIN, VLLM_CPU_KVCACHE_SPACE="2", TMPDIR=work)
    try:
        with open(os.path.join(work, "job.log"), "w") as log:
            subprocess.run([find_engine_python("vllm").python, os.path.join(PLUGIN, "tests", "engine_job.py"), job],
                           stdout=log, stderr=subprocess.STDOUT, env=env, check=True, cwd=work)
        with open(out) as f:
            r = json.load(f)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the float32 checkpoint: a GiB on Gemma 3 270M
    if "error" in r:
        raise SystemExit(f"vLLM refused: {r['error']}")
    print(f"{args.model}: {len(dtypes)} layers, plan {','.join(dtypes)}")
    for itemsize, name in ((4, "float32 (as served here)"), (2, "bf16")):
        pool = vllm_cpu_pool(shape, itemsize)
        print(f"  sensprof's arithmetic at {name}: {pool.bytes_per_token:g} B/token in {len(pool.groups)} groups, "
              f"the layers' own {pool.own_bytes_per_token} (padded: {pool.padded})")
    kv = r["kv"]
    print(f"  vLLM's KV cache config: {kv['bytes_per_token']:g} B/token in {len(kv['group_layers'])} groups (block "
          f"sizes {sorted(set(kv['group_block_sizes']))}), {kv['num_blocks']} blocks")
    got = [(l["kv_cache_dtype"], l["backend"], "/".join(l["formats"])) for l in r["layers"]]
    want = [("auto", "SENSPROF_KV", d[2:].replace("/v:", "/")) if d.startswith("k:") else (d, "CPU_ATTN", "")
            for d in dtypes]
    print(f"  every layer as planned: {got == want}; tokens alone == batched: {r['alone'] == r['together']}; "
          f"prompts {lengths}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
