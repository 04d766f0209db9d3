"""As run: the plans named on the command line measured on the 3 windows of the built-in mixture that around_uniform.py
chose its cells on (1024 tokens, seed 0), read as the plans read."""
import sys
from sensprof.artifacts import load_plan
from sensprof.corpus import builtin_corpus
from sensprof.data import text_windows
from sensprof.models import load_for_profile
from sensprof.profiling.table import load_profile
from sensprof.validation.validate import layer_choices, measure, plan_reads
meta = load_profile("/work/main/profiles/gemma3-270m", require_complete=True).meta
plans = {p: load_plan(p) for p in sys.argv[1:]}
first = next(iter(plans.values()))
loaded = load_for_profile(first, meta)
ids = text_windows(loaded.tokenizer, builtin_corpus(), "mix", 1024, 3, 0)[0]
named = {p: list(pl.layers) for p, pl in plans.items()}
m = measure(loaded.model, ids, named, reads=plan_reads(first), per_token=True)
for p in plans: print(p, m[p]["kl"], m[p]["kl_tokens"].mean(dim=-1).tolist())
