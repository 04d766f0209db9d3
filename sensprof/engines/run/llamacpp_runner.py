"""Run windows through llama.cpp (llama-cpp-python) with each K/V cache type pair and measure, per token, the NLL of
the text and the KL of the next-token distribution against the baseline pair (the job's first configuration).

Executed by the engine's own Python (`python llamacpp_runner.py JOB.json`; sensprof runs it as a subprocess), so it
imports only llama_cpp, numpy and the standard library. The model is the GGUF file itself; flash attention is on
for every pair (llama.cpp needs it for a quantized V cache). A window is one batch, so every position is written to the
cache and read back from it, as it is during serving; a configuration may name a smaller `ubatch` (the engine's
numerical floor, sensprof/validation/validate_engine.py LLAMACPP_FLOOR).
The output (JSON) holds, per configuration, `nll` and `kl` as lists [windows][tokens - 1] and `top1` (the share of
positions whose most likely token is the baseline's), and llama.cpp's version."""

from __future__ import annotations

import faulthandler
import json
import os
import sys


def _usable_cores() -> int:
    """The cores this process may run on (taskset, a container's cpuset), not the machine's: llama.cpp's threads spin,
    and more threads than cores would wait on each other."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _type(name: str) -> int:
    import llama_cpp

    attr = f"GGML_TYPE_{name.upper()}"
    if not hasattr(llama_cpp, attr):
        raise ValueError(f"llama.cpp has no cache type {name!r}")
    return int(getattr(llama_cpp, attr))


def _log_softmax(z):
    import numpy as np

    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))


def _logits(job: dict, config: dict):
    """[windows][tokens, vocab] float32 logits of every position with this cache pair."""
    from llama_cpp import Llama

    n = max(len(w) for w in job["windows"])
    ubatch = min(config.get("ubatch") or n, n, 512)  # a smaller one: the engine's floor (validate_engine.py)
    llm = Llama(model_path=job["model"], n_ctx=n, n_batch=n, n_ubatch=ubatch, logits_all=True,
                type_k=_type(config["type_k"]), type_v=_type(config["type_v"]), flash_attn=True, seed=0,
                n_threads=job.get("threads") or _usable_cores(), verbose=False)
    try:
        for ids in job["windows"]:
            llm.reset()
            llm.eval(list(ids))
            yield llm.scores[: len(ids)].copy()
    finally:
        llm.close()


def main(job_path: str) -> int:
    faulthandler.enable()  # a crash inside llama.cpp leaves its Python stack in the log (process.crash_note)
    import numpy as np
    import llama_cpp

    with open(job_path) as f:
        job = json.load(f)
    base, out = None, {"llama_cpp_version": llama_cpp.__version__, "configs": {}}
    for i, config in enumerate(job["configs"]):
        nll, kl, top1 = [], [], []
        for w, z in enumerate(_logits(job, config)):
            ids = np.asarray(job["windows"][w])
            lp = _log_softmax(z[:-1])
            nll.append((-lp[np.arange(len(ids) - 1), ids[1:]]).tolist())
            if i == 0:
                base = base or []
                base.append(lp.astype(np.float32))
                kl.append([0.0] * (len(ids) - 1))
                top1.append(1.0)
            else:
                lb = base[w].astype(np.float64)
                kl.append(np.maximum((np.exp(lb) * (lb - lp)).sum(-1), 0.0).tolist())
                top1.append(float((lb.argmax(-1) == lp.argmax(-1)).mean()))
        out["configs"][config["name"]] = {"nll": nll, "kl": kl, "top1": float(np.mean(top1)),
                                          "type_k": config["type_k"], "type_v": config["type_v"]}
    tmp = job["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
