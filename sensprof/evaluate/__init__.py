"""`sensprof eval`: long-context probes (retrieval, passkey) and perplexity through the runtime cache; lm-evaluation-
harness tasks (lm_eval_run, lm_eval_model: optional, imported only when asked for)."""

from .run import eval_configs, evaluate, format_eval
from .tasks import TASKS, Sample, build_sample, parse_depths, parse_lengths, score

__all__ = ["TASKS", "Sample", "build_sample", "eval_configs", "evaluate", "format_eval", "parse_depths",
           "parse_lengths", "score"]
