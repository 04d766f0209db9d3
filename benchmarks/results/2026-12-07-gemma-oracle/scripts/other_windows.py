"""As run: python other_windows.py OUT.txt: the text of IDLE's help.html outside the README table's 8 judged windows
(slots 0, 4, 6, 9, 11, 13, 15, 17 of 1023 tokens after BOS, seed 12345), each run of free slots decoded with Gemma 3's
tokenizer, runs joined by a blank line: "the user's own text" for plan --select-text, disjoint from the windows the
plans are judged on."""
import os
import sys

import idlelib

from transformers import AutoTokenizer

from sensprof.data import text_windows, tokenize
from sensprof.models import resolve_model

spec = resolve_model("gemma3-270m")
tok = AutoTokenizer.from_pretrained(spec["path"], gguf_file=spec["gguf_file"])
with open(os.path.join(os.path.dirname(idlelib.__file__), "help.html"), encoding="utf-8") as f:
    text = f.read()
_, _, _, judged = text_windows(tok, text, "html", 1024, 8, 12345)
ids, body = tokenize(tok, text), 1023
runs, run = [], []
for s in range(len(ids) // body + 1):
    if s in judged:
        if run:
            runs.append(run)
        run = []
    else:
        run += ids[s * body:(s + 1) * body]
if run:
    runs.append(run)
out = "\n\n".join(tok.decode(r) for r in runs)
with open(sys.argv[1], "w", encoding="utf-8") as f:
    f.write(out)
print(f"judged slots {judged}; {len(ids)} tokens, {len(ids) // body} whole slots; {len(runs)} runs of free slots, "
      f"{sum(map(len, runs))} tokens -> {sys.argv[1]}")
