"""Run windows through vLLM's offline `LLM` and save the final hidden state of every prompt position.

Executed by the engine's own Python (sensprof runs it as a subprocess: `python vllm_runner.py JOB.json`), so it
imports only vLLM, torch and the standard library. The job names the token windows and a list of configurations
(checkpoint, `kv_cache_dtype`, `kv_cache_dtype_skip_layers`, output file). vLLM is imported once, then each
configuration runs in a forked child, so that no engine state or thread outlives its configuration. Each output
(`torch.save`) holds `hidden` [windows, tokens, hidden] float32 and what vLLM resolved per attention layer (cache
dtype, k_scale/v_scale, attention ISA); a failing configuration leaves its error in `<out>.error`.

Why hidden states: a teacher-forced prefill of the window writes every token to the cache and (vLLM's CPU backend)
reads every token back from it, the current chunk included, so the decoder's final hidden states carry the full
cache effect, and sensprof applies the model's own LM head to them (the full vocabulary, without returning
[tokens, vocab] log-probabilities through vLLM's logprobs API, which caps them at max_logprobs).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys


def _final_norm(model):
    for name in ("model.norm", "model.language_model.norm", "language_model.model.norm"):
        mod = model
        try:
            for part in name.split("."):
                mod = getattr(mod, part)
            return mod
        except AttributeError:
            continue
    raise RuntimeError(f"cannot find the final norm of {type(model).__name__}")


def _install_capture(model):
    store = []

    def hook(_mod, _inputs, output):
        h = output[0] if isinstance(output, tuple) else output
        store.append(h.detach().float().cpu().clone())

    model._sensprof_hidden = store
    model._sensprof_handle = _final_norm(model).register_forward_hook(hook)
    return True


def _take_capture(model):
    import torch

    store = model._sensprof_hidden
    out = torch.cat(store, 0) if store else None
    store.clear()
    return out


def _describe(model):
    """What vLLM resolved per attention layer: its cache dtype (for a layer on the sensprof plugin's SENSPROF_KV
    backend, the K and V formats that backend class stores, "k:<K>/v:<V>"), backend, scales and attention ISA."""
    layers = []
    for name, mod in model.named_modules():
        if type(mod).__name__ == "Attention" and hasattr(mod, "kv_cache_dtype"):
            backend = mod.attn_backend
            dtype = str(mod.kv_cache_dtype)
            if backend.get_name() == "SENSPROF_KV":
                dtype = f"k:{backend.key.name}/v:{backend.value.name}"
            layers.append({"name": name, "kv_cache_dtype": dtype, "backend": backend.get_name(),
                           "k_scale": float(getattr(mod, "_k_scale_float", 1.0)),
                           "v_scale": float(getattr(mod, "_v_scale_float", 1.0)),
                           "isa": str(getattr(mod, "isa", ""))})
    return layers


def run_config(job: dict, config: dict) -> None:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=config["model"], dtype=job.get("dtype", "float32"), enforce_eager=True,
                  kv_cache_dtype=config["kv_cache_dtype"], max_model_len=job["max_model_len"],
                  enable_prefix_caching=False, seed=0, max_num_seqs=1)
    if config.get("skip_layers"):
        kwargs["kv_cache_dtype_skip_layers"] = [str(s) for s in config["skip_layers"]]
    if config.get("additional_config"):  # a per-layer plan for sensprof's vLLM plugin
        kwargs["additional_config"] = config["additional_config"]
    llm = LLM(**kwargs)
    llm.apply_model(_install_capture)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    hidden = []
    for ids in job["windows"]:
        llm.apply_model(_take_capture)  # drop anything captured outside this prompt (warm-up, profiling runs)
        llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)
        h = llm.apply_model(_take_capture)[0]
        if h is None or h.shape[0] < len(ids):
            raise RuntimeError(f"captured {0 if h is None else h.shape[0]} hidden states for a {len(ids)}-token prompt")
        hidden.append(h[: len(ids)])
    info = llm.apply_model(_describe)[0]
    tmp = config["out"] + ".tmp"
    torch.save({"hidden": torch.stack(hidden), "layers": info, "vllm_version": _version()}, tmp)
    os.replace(tmp, config["out"])


def main(job_path: str) -> int:
    with open(job_path) as f:
        job = json.load(f)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model runs in this (forked) process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gib", 1)))
    faulthandler.enable()  # a config that dies of a signal leaves its Python stack in the log (process.crash_note)
    import vllm  # noqa: F401  (once, before the forks: the slow part of a start)

    failed = 0
    for config in job["configs"]:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_config(job, config)
            except BaseException as e:  # the parent reports it; the child's last line says what vLLM raised
                with open(config["out"] + ".error", "w") as f:
                    f.write(f"{type(e).__name__}: {e}".strip().splitlines()[-1] if str(e) else type(e).__name__)
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0 and not os.path.exists(config["out"] + ".error"):
            with open(config["out"] + ".error", "w") as f:
                f.write(child_failure(status))
        failed += status != 0
    return 1 if failed else 0


def child_failure(status: int) -> str:
    """What a config's process ended with (os.waitpid's status): SIGKILL is what the out-of-memory killer sends;
    SIGABRT is an abort inside the process (glibc's heap checks among them: their message is in the log)."""
    import signal

    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:  # a number the signal module does not name
            name = f"signal {sig}"
        hint = {signal.SIGKILL: " (out of memory?)", signal.SIGABRT: " (an abort inside vLLM or a library it calls; "
                                                                   "the log above says which)"}.get(sig, "")
        return f"the vLLM process was killed by {name}{hint}"
    return f"the vLLM process exited with status {os.WEXITSTATUS(status)}"


def _version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "?"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
