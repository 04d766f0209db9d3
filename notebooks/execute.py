"""Execute walkthrough.ipynb in place (outputs and plots saved into the notebook). Run from anywhere."""

import os
import sys

import nbformat
from nbclient import NotebookClient

here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, sys.argv[1] if len(sys.argv) > 1 else "walkthrough.ipynb")
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": here}}).execute()
nbformat.write(nb, path)
print(f"executed {path}")
