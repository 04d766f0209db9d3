"""Offline lm-eval tasks over the built-in corpus, for machines without a hub: a long-context pass-key recall
(generate_until) and whole-passage perplexity (loglikelihood_rolling), each a YAML file over a local JSONL file.

`python -m sensprof.evaluate.lm_eval_tasks DIR [--docs N] [--chars C]`, then
`sensprof eval --plan P --lm-eval-tasks sp_passkey,sp_pydoc_ppl --lm-eval-include DIR`. Needs no lm-eval to write.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

from ..errors import SensprofError
from ..files import atomic_write_text
from .tasks import PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION

TASKS = ("sp_passkey", "sp_pydoc_ppl")

PASSKEY_YAML = """task: sp_passkey
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
filter_list:
  - name: key
    filter:
      - function: regex
        regex_pattern: "(\\\\d{{5}})"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

PPL_YAML = """task: sp_pydoc_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""


def passkey_docs(corpus: str, docs: int, chars: int, seed: int = 0) -> list[dict]:
    """`docs` prompts of about `chars` characters of corpus filler with a 5-digit key at depths spread over
    0.1..0.9, asking for the key at the end."""
    rng = random.Random(seed)
    out = []
    for i in range(docs):
        key = rng.randrange(10_000, 100_000)
        start = rng.randrange(0, len(corpus) - chars)
        filler = corpus[start:start + chars]
        depth = 0.1 + 0.8 * i / max(docs - 1, 1)
        cut = filler.rfind(" ", 0, int(depth * chars)) + 1
        prompt = (PASSKEY_INTRO + filler[:cut] + PASSKEY_NEEDLE.format(key=key) + filler[cut:]
                  + PASSKEY_QUESTION)
        out.append({"prompt": prompt, "answer": str(key), "depth": round(depth, 3)})
    return out


def passage_docs(corpus: str, docs: int, chars: int) -> list[dict]:
    """`docs` consecutive passages of about `chars` characters from the middle of the corpus, cut at blank lines."""
    out, pos = [], len(corpus) // 2
    for _ in range(docs):
        end = corpus.find("\n\n", pos + chars)
        end = len(corpus) if end < 0 else end
        out.append({"text": corpus[pos:end].strip()})
        pos = end
    return out


def write_tasks(directory: str, docs: int = 20, chars: int = 4000) -> list[str]:
    """Write both tasks (YAML + JSONL) into `directory`; returns the task names."""
    from ..data import PYDOC_NAME, builtin_corpus

    if docs < 1 or chars < 200:
        raise SensprofError(f"--docs {docs} / --chars {chars}: use at least 1 document of 200 characters")
    corpus = builtin_corpus(PYDOC_NAME)  # the tasks are named for pydoc's prose and read only it
    os.makedirs(directory, exist_ok=True)
    for name, rows, yaml in (("sp_passkey", passkey_docs(corpus, docs, chars), PASSKEY_YAML),
                             ("sp_pydoc_ppl", passage_docs(corpus, docs, chars), PPL_YAML)):
        data = os.path.abspath(os.path.join(directory, f"{name}.jsonl"))
        atomic_write_text(data, "".join(json.dumps(r) + "\n" for r in rows))
        atomic_write_text(os.path.join(directory, f"{name}.yaml"), yaml.format(data=json.dumps(data)))
    return list(TASKS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sensprof.evaluate.lm_eval_tasks", description=__doc__.split("\n")[0])
    p.add_argument("dir", help="directory for the YAML and JSONL files (pass it to --lm-eval-include)")
    p.add_argument("--docs", type=int, default=20, help="documents per task (default 20)")
    p.add_argument("--chars", type=int, default=4000, help="characters per document, about 4 per token (default 4000)")
    args = p.parse_args(argv)
    try:
        names = write_tasks(args.dir, args.docs, args.chars)
    except SensprofError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(names)} into {args.dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
