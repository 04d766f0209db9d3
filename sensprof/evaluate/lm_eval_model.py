"""The `sensprof` model type of lm-evaluation-harness: lm-eval's HFLM with every request run through a fresh
PlannedCache, so a plan is scored on the benchmarks people already use, with its cache as a server holds it.

Importing this module registers the model (`lm_eval.api.registry.register_model("sensprof")`); it needs lm-eval
(`pip install 'sensprof[eval]'`). Each request runs alone (batch 1) with its own cache: a padded batch would put
pad tokens into the quantization groups. A log-likelihood request prefills its context in `chunk`-token forwards,
then scores the continuation in one more forward over the quantized context; a generation request prefills all
but the prompt's last token the same way and decodes through the same cache.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm

from ..errors import SensprofError
from .lm_eval_quiet import quiet_lm_eval
from .run import feed, use_sdpa

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CacheStats:
    """What the runtime caches held at the end of their requests: summed over every request."""

    caches: int = 0
    tokens: int = 0
    nbytes: int = 0

    def add(self, cache) -> None:
        self.caches += 1
        self.tokens += cache.get_seq_length()
        self.nbytes += cache.nbytes()

    def bytes_per_token(self) -> float:
        return self.nbytes / self.tokens if self.tokens else float("nan")


def _load_plan(plan):
    from ..artifacts import Plan, load_plan

    if plan is None:
        raise SensprofError("the sensprof model needs a plan: --model_args plan=PLAN.json (from `sensprof plan`)")
    return plan if isinstance(plan, Plan) else load_plan(str(plan))


@register_model("sensprof")
class SensprofLM(HFLM):
    """`lm_eval --model sensprof --model_args plan=PLAN.json[,pretrained=MODEL][,chunk=512][,kernels=auto]`.

    `pretrained`: a hub id, directory, .gguf or alias (default: the plan's model), loaded as sensprof loads it
    and refused unless it is the model the plan was made for; or a loaded model with `tokenizer=`.
    `plan`: a plan path or a `Plan`. `chunk`: tokens per prefill forward. `kernels`: as `PlannedCache.from_plan`.
    A request longer than the model's positions (`max_length`) is refused; `truncate=left` (opt-in) cuts it from
    the left instead, with a warning that says how many tokens were cut.
    """

    def __init__(self, pretrained=None, plan=None, tokenizer=None, chunk: int = 512, kernels: str = "auto",
                 device: str | None = None, dtype: str | None = None, device_map: str | None = None,
                 trust_remote_code: bool = False, batch_size=1, truncate=None, **kwargs):
        from ..models import load_for_plan

        plan = _load_plan(plan)
        if int(chunk) < 1:
            raise SensprofError(f"chunk={chunk} is too small; use a positive number of tokens, e.g. 512")
        if pretrained is None or isinstance(pretrained, str):
            loaded = load_for_plan(plan, pretrained, device or "auto", None if dtype == "auto" else dtype,
                                   device_map, bool(trust_remote_code))
            use_sdpa(loaded.model)
            pretrained, tokenizer = loaded.model, tokenizer or loaded.tokenizer
        elif tokenizer is None:
            raise SensprofError("a loaded model needs its tokenizer: SensprofLM(pretrained=model, tokenizer=tok, ...)")
        if str(batch_size) != "1":
            log.warning("sensprof runs one request at a time, each with a fresh cache; batch_size=%s ignored",
                        batch_size)
        with quiet_lm_eval("lm_eval.models.huggingface"):  # not its warnings that a loaded model skips loading
            super().__init__(pretrained=pretrained, tokenizer=tokenizer, batch_size=1, **kwargs)
        self.plan, self.chunk, self.kernels = plan, int(chunk), kernels
        if truncate not in (None, False, "", "none", "left", True):
            raise SensprofError(f"truncate={truncate!r} is not 'left'; pass truncate=left to cut long requests "
                                "from the left, or leave it out to refuse them")
        self.truncate = truncate in ("left", True)
        self.stats = CacheStats()
        self.new_cache(check_model=True)  # a plan for another model or an unstorable scheme fails here, once

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval import utils

        return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string or ""), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's --model_args beside its own flags (--device, --batch_size): a setting given both ways with two
        values is one line naming both (lm-eval passed both and Python raised a TypeError)."""
        import inspect

        known = {name for c in (cls, HFLM) for name, p in inspect.signature(c.__init__).parameters.items()
                 if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}
        unknown = sorted(set(arg_dict) - known)  # HFLM would hand them to from_pretrained, which a loaded model skips
        if unknown:
            raise SensprofError(f"unknown --model_args {', '.join(unknown)} for the sensprof model; it takes "
                                f"{', '.join(sorted(known))}")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        clash = sorted(k for k in set(arg_dict) & set(extra) if str(arg_dict[k]) != str(extra[k]))
        if clash:
            k = clash[0]
            raise SensprofError(f"{k} is given twice: {k}={arg_dict[k]} in --model_args and --{k} {extra[k]}; pass "
                                "it once")
        return cls(**(extra | dict(arg_dict)))

    def new_cache(self, check_model: bool = False):
        """A fresh PlannedCache for one request."""
        from ..runtime import PlannedCache

        return PlannedCache.from_plan(self.plan, self.model, check_model=check_model, kernels=self.kernels)

    @property
    def input_device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @torch.inference_mode()
    def score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """(summed log-probability of the continuation, whether greedy decoding gives it), through a fresh cache."""
        self.check_length(len(context) + len(continuation) - 1, self.max_length, "log-likelihood")
        inp = (context + continuation)[-(self.max_length + 1):][:-1]
        split = len(inp) - len(continuation)  # the context part is prefilled; the rest scores the continuation
        ids = torch.tensor([inp], dtype=torch.long, device=self.input_device)
        cache = self.new_cache()
        feed(self.model, ids, cache, self.chunk, upto=split)
        logits = feed(self.model, ids[:, split:], cache, self.chunk, all_logits=True)[0]
        self.stats.add(cache)
        logprobs = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
        target = torch.tensor(continuation, dtype=torch.long, device=logprobs.device)
        greedy = bool((logprobs.argmax(dim=-1) == target).all())
        return float(logprobs.gather(-1, target[:, None]).sum()), greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        res = []
        for request_str, context, continuation in tqdm(requests, disable=disable_tqdm or self.rank != 0,
                                                       desc="Running loglikelihood requests (sensprof cache)"):
            answer = self.score(context, continuation)
            res.append(answer)
            if request_str is not None:  # loglikelihood_rolling's windows have none: it caches per document
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
        return res

    def check_length(self, n: int, limit: int, what: str) -> None:
        """A request of n tokens where the model takes `limit`: refused, or with truncate=left cut (and said)."""
        if n <= limit:
            return
        if not self.truncate:
            raise SensprofError(
                f"an lm-eval {what} request of {n} tokens is longer than the {limit} the model takes (its "
                f"max_length); lm-eval would cut {n - limit} tokens off its start: use tasks or --num-fewshot that "
                "fit, or pass --lm-eval-truncate (lm_eval: truncate=left) to cut them with a warning")
        log.warning("sensprof: cut %d tokens from the left of a %d-token lm-eval %s request (the model takes %d)",
                    n - limit, n, what, limit)

    def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
        if left_truncate_len:  # generation: the context must leave room for the tokens to generate
            n = super().tok_batch_encode(strings, padding_side, None, truncation)[0].shape[1]
            self.check_length(n + self.max_length - left_truncate_len, self.max_length,
                              "generation (context plus the tokens to generate)")
        return super().tok_batch_encode(strings, padding_side, left_truncate_len, truncation)

    @torch.inference_mode()
    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        from ..runtime.generate import cache_kwarg

        if context.shape[0] != 1:
            raise SensprofError(f"sensprof generates one request at a time, got a batch of {context.shape[0]}")
        cache = self.new_cache()
        feed(self.model, context, cache, self.chunk, upto=context.shape[1] - 1)
        generation_kwargs[cache_kwarg(self.model)] = cache
        out = super()._model_generate(context, max_length, stop, **generation_kwargs)
        self.stats.add(cache)
        return out

    def get_model_info(self) -> dict:
        return {"model_num_parameters": sum(p.numel() for p in self.model.parameters()),
                "model_dtype": str(next(self.model.parameters()).dtype), "sensprof_plan_model": self.plan.model_id}
