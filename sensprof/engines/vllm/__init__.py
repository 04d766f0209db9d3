"""vLLM 0.33 KV-cache dtypes: faithful write/read emulations (torch) and the facts the planner needs (no torch)."""
