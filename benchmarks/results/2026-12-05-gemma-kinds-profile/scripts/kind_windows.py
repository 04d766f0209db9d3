# As run: OMP_NUM_THREADS=2 python kind_windows.py (in an empty folder; then mkdir kinds and move the three files into kinds/ as 1-prose.txt, 2-code.txt, 3-records.txt)
# One window of 1023 Gemma tokens per kind of the built-in mixture (tokens 1000-2022 of each kind), for a 3-window profile whose windows are one kind each.
from sensprof.corpus import kind_texts
from sensprof.models import load_model
loaded = load_model("gemma3-270m", device="cpu", dtype="float32")
tok = loaded.tokenizer
for kind, text in kind_texts().items():
    ids = tok(text[:200000], add_special_tokens=False)["input_ids"]
    piece = tok.decode(ids[1000:1000 + 1023])
    n = len(tok(piece, add_special_tokens=False)["input_ids"])
    open(f"{kind}.txt", "w").write(piece)
    print(kind, n)
