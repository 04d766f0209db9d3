# As run: python window_shifts.py KINDS_FOLDER N (in the folder holding it): where each file of KINDS_FOLDER starts
# in the window `sensprof profile --text KINDS_FOLDER --windows N --seq-len 1024` makes of it. The files are joined
# with a blank line ("\n\n", one token) into one text cut into 1023-token slots after the BOS, so the i-th file's
# window holds it shifted by about i tokens and short of as many at its end.
import os
import sys

from sensprof.data import select_windows
from sensprof.models import load_model

folder, n = sys.argv[1], int(sys.argv[2])
tok = load_model("gemma3-270m", device="cpu", dtype="float32").tokenizer
ids, *_ = select_windows(tok, [folder], 1024, n)
for i, name in enumerate(sorted(os.listdir(folder))[:n]):
    own = tok(open(os.path.join(folder, name)).read(), add_special_tokens=False)["input_ids"]
    row = ids[i].tolist()
    start = next((s for s in range(1, 40) if row[s:s + 50] == own[:50]), None)
    print(f"window {i}: {name} starts at position {start} (1 = right after the BOS, as alone)")
