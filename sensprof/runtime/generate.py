"""Try a plan: generate text through the planned cache and report its bytes and speed."""

from __future__ import annotations

import inspect
import time

import torch


def cache_kwarg(model) -> str:
    """transformers 5.24 renamed the cache argument `past_key_values` to `cache`; support both."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_prompts(prompts: list[str]) -> None:
    from ..errors import SensprofError

    if not prompts:
        raise SensprofError("no prompt given; pass --prompt TEXT")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise SensprofError(f"--prompt number {i + 1} is empty; pass the text to continue, e.g. "
                                "--prompt 'Once upon'")


@torch.inference_mode()
def generate_with_plan(model, tokenizer, plan, prompts: list[str], max_new_tokens: int = 64, do_sample: bool = False,
                       seed: int = 0, kernels: str = "auto", packed_decode: bool = True) -> dict:
    from ..errors import SensprofError
    from ..models import max_positions
    from .cache import PlannedCache

    check_prompts(prompts)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.get_input_embeddings().weight.device)
    n, limit = enc["input_ids"].shape[1], max_positions(model)
    if limit is not None and n + max_new_tokens > limit:
        raise SensprofError(f"the prompt of {n} tokens plus --max-new-tokens {max_new_tokens} runs to "
                            f"{n + max_new_tokens} positions, past the model's {limit} positions; shorten the prompt "
                            "or lower --max-new-tokens")
    cache = PlannedCache.from_plan(plan, model, kernels=kernels, packed_decode=packed_decode)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=do_sample,
                         pad_token_id=tokenizer.pad_token_id, **{cache_kwarg(model): cache})
    elapsed = time.perf_counter() - t0
    new = out[:, enc["input_ids"].shape[1]:]
    return {"texts": tokenizer.batch_decode(new, skip_special_tokens=True), "ids": new, "tokens": int(new.numel()),
            "seconds": elapsed, "tokens_per_s": new.numel() / elapsed, "cache_bytes": cache.nbytes(),
            "cache_tokens": cache.get_seq_length(),
            "packed_steps": sum(getattr(layer, "packed_steps", 0) for layer in cache.layers),
            "kernels": _kernel_name(cache)}


def _kernel_name(cache) -> str:
    used = {layer.kernels.NAME for layer in cache.layers if layer.kernels is not None}
    return "/".join(sorted(used)) or "no"
