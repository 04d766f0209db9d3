# As run: OMP_NUM_THREADS=2 python kind_windows6.py [PART:START ...] (in an empty folder): kinds/, windows of 1023
# Gemma tokens per kind of the built-in mixture, kinds/<i><PART>-<kind>.txt from each kind's token START. Default
# a:1000 b:3000 (tokens 1000-2022, the 3-window profile's windows, and 3000-4022); ../../2026-12-06-gemma-9-windows
# ran it with c:5000.
import os
import sys

from sensprof.corpus import kind_texts
from sensprof.models import load_model

parts = [(p, int(s)) for p, s in (arg.split(":") for arg in sys.argv[1:] or ["a:1000", "b:3000"])]
loaded = load_model("gemma3-270m", device="cpu", dtype="float32")
tok = loaded.tokenizer
os.makedirs("kinds", exist_ok=True)
for i, (kind, text) in enumerate(kind_texts().items(), 1):
    ids = tok(text[:200000], add_special_tokens=False)["input_ids"]
    for part, start in parts:
        piece = tok.decode(ids[start:start + 1023])
        n = len(tok(piece, add_special_tokens=False)["input_ids"])
        with open(f"kinds/{i}{part}-{kind}.txt", "w") as f:
            f.write(piece)
        print(kind, part, n)
