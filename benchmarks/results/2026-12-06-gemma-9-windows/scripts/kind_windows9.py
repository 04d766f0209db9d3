# Third window per kind: tokens 5000-6022 of each kind (kind_windows6.py took 1000-2022 and 3000-4022).
import os
from sensprof.corpus import kind_texts
from sensprof.models import load_model
loaded = load_model("gemma3-270m", device="cpu", dtype="float32")
tok = loaded.tokenizer
os.makedirs("kinds", exist_ok=True)
for i, (kind, text) in enumerate(kind_texts().items(), 1):
    ids = tok(text[:200000], add_special_tokens=False)["input_ids"]
    start = 5000
    piece = tok.decode(ids[start:start + 1023])
    n = len(tok(piece, add_special_tokens=False)["input_ids"])
    with open(f"kinds/{i}c-{kind}.txt", "w") as f:
        f.write(piece)
    print(kind, "c", n, len(ids))
