# As run: OMP_NUM_THREADS=2 python kind_windows6.py (in an empty folder): kinds/, two windows of 1023 Gemma tokens per
# kind of the built-in mixture: tokens 1000-2022 (the 3-window profile's windows) and 3000-4022 of each kind.
import os
from sensprof.corpus import kind_texts
from sensprof.models import load_model
loaded = load_model("gemma3-270m", device="cpu", dtype="float32")
tok = loaded.tokenizer
os.makedirs("kinds", exist_ok=True)
for i, (kind, text) in enumerate(kind_texts().items(), 1):
    ids = tok(text[:200000], add_special_tokens=False)["input_ids"]
    for part, start in (("a", 1000), ("b", 3000)):
        piece = tok.decode(ids[start:start + 1023])
        n = len(tok(piece, add_special_tokens=False)["input_ids"])
        with open(f"kinds/{i}{part}-{kind}.txt", "w") as f:
            f.write(piece)
        print(kind, part, n)
