"""Executes every notebook top to bottom with its small settings (as CI does).

Each notebook runs in a fresh kernel in a temporary folder, with
VAMPIRE_JAX_SMALL=1 and OMNIGLOT_DIR pointing at ../shared/data/omniglot
when present. A cell that raises fails the test, so does a notebook that
runs past its time limit.
"""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
OMNIGLOT_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "omniglot"
TIME_LIMIT_S = 600  # per notebook


def test_there_are_three_notebooks_with_a_colab_badge_and_no_outputs():
  assert len(NOTEBOOKS) == 3, NOTEBOOKS
  for path in NOTEBOOKS:
    notebook = nbformat.read(path, as_version=4)
    assert "colab.research.google.com" in notebook.cells[0].source, path
    assert "pip install" in notebook.cells[1].source, path
    # Colab has its own TensorFlow: the install cell takes the experiments' extra, not data's.
    assert "[experiments]" in notebook.cells[1].source and "[data]" not in notebook.cells[1].source
    for cell in notebook.cells:
      if cell.cell_type == "code":
        assert not cell.outputs and cell.execution_count is None, f"{path}: outputs not stripped"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
  if (
    "omniglot" in path.stem
    and not (OMNIGLOT_DIR / "images_background.zip").exists()
    and not os.environ.get("OMNIGLOT_DIR")
  ):
    pytest.skip(f"Omniglot zips not found at {OMNIGLOT_DIR}; set OMNIGLOT_DIR")
  # The notebooks import the experiments, which a clone has, not the wheel: the kernel
  # runs in a temporary folder, so the repository goes on its path.
  monkeypatch.setenv(
    "PYTHONPATH",
    os.pathsep.join(
      [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    ),
  )
  monkeypatch.setenv("VAMPIRE_JAX_SMALL", "1")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setenv("OMNIGLOT_DIR", os.environ.get("OMNIGLOT_DIR", str(OMNIGLOT_DIR)))
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
    notebook,
    timeout=TIME_LIMIT_S,
    kernel_name="python3",
    resources={"metadata": {"path": str(tmp_path)}},
  )
  client.execute()
  errors = [
    o
    for c in notebook.cells
    if c.cell_type == "code"
    for o in c.outputs
    if o.output_type == "error"
  ]
  assert not errors
