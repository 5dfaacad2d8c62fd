"""The notebooks: stored with their outputs, and executed top to bottom as CI does.

The stored notebooks are read as committed: every code cell executed once, in order, with
its outputs (figures inline) and no error. CI then executes each from a temporary copy
(the committed file is never rewritten), in a fresh kernel in a temporary folder, with
VAMPIRE_JAX_SMALL=1 and OMNIGLOT_DIR pointing at ../shared/data/omniglot when present. A
cell that raises fails the test, so does a notebook that runs past its time limit.

After changing a notebook, store it again with its outputs (from the repository's root):

    python tests/test_notebooks.py                      # all three
    python tests/test_notebooks.py 01_quickstart_regression
"""

import os
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
OMNIGLOT_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "omniglot"
TIME_LIMIT_S = 600  # per notebook
MAX_STORED_BYTES = 2_000_000  # per notebook, figures included
# A cell whose source has one of these makes output; figures make an image.
PRINTS = ("print(", "display(", "plt.show()")
FIGURES = ("display(Image", "plt.show()")
# Outputs must not name the machine they ran on.
LOCAL_PATH = re.compile(r"(/tmp/|/work/|/home/|/root/|/Users/|[A-Z]:\\)")


def _code_cells(notebook):
  return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _output_text(cell) -> str:
  parts = []
  for output in cell.outputs:
    if output.output_type == "stream":
      parts.append(output.text)
    elif output.output_type in ("display_data", "execute_result"):
      parts.append(output.get("data", {}).get("text/plain", ""))
    elif output.output_type == "error":
      parts.append(output.ename + ": " + output.evalue)
  return "".join(parts)


def _has_image(cell) -> bool:
  return any("image/png" in output.get("data", {}) for output in cell.outputs)


def _environment() -> dict:
  """The kernel's environment: small settings, the repository importable, figures inline."""
  # The notebooks import the experiments, which a clone has, not the wheel: the kernel
  # runs in a temporary folder, so the repository goes on its path.
  path = [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
  return {
    "PYTHONPATH": os.pathsep.join(path),
    "VAMPIRE_JAX_SMALL": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "OMNIGLOT_DIR": os.environ.get("OMNIGLOT_DIR", str(OMNIGLOT_DIR)),
  }


def execute(path: Path, folder: Path):
  """Executes a copy of the notebook at `path` in `folder`; returns the executed notebook."""
  copy = folder / path.name
  shutil.copyfile(path, copy)
  notebook = nbformat.read(copy, as_version=4)
  client = nbclient.NotebookClient(
    notebook,
    timeout=TIME_LIMIT_S,
    kernel_name="python3",
    record_timing=False,  # no timestamps in the stored cells
    coalesce_streams=True,  # a cell's printed lines as one output
    resources={"metadata": {"path": str(folder)}},
  )
  client.execute()
  return notebook


def stored_problems(notebook, *, local_paths: bool = True) -> list[str]:
  """What is wrong with a notebook as stored: [] when every code cell ran once, in order.

  `local_paths=False` allows outputs that name local folders (a run in CI prints them).
  """
  problems = []
  for number, cell in enumerate(_code_cells(notebook), start=1):
    where = f"code cell {number}"
    if cell.execution_count != number:
      problems.append(f"{where}: execution count {cell.execution_count}, expected {number}")
    if any(o.output_type == "error" for o in cell.outputs):
      problems.append(f"{where}: stored with an error")
    if any(s in cell.source for s in PRINTS) and not cell.outputs:
      problems.append(f"{where}: no outputs")
    if any(s in cell.source for s in FIGURES) and not _has_image(cell):
      problems.append(f"{where}: no figure")
    local = LOCAL_PATH.search(_output_text(cell))
    if local_paths and local:
      problems.append(f"{where}: a local path in its outputs: {local[0]}")
  return problems


def test_there_are_three_notebooks_with_a_colab_badge_and_an_install_cell_without_tensorflow():
  assert len(NOTEBOOKS) == 3, NOTEBOOKS
  for path in NOTEBOOKS:
    notebook = nbformat.read(path, as_version=4)
    assert "colab.research.google.com" in notebook.cells[0].source, path
    assert "pip install" in notebook.cells[1].source, path
    # Colab has its own TensorFlow: the install cell takes the experiments' extra, not data's.
    assert "[experiments]" in notebook.cells[1].source and "[data]" not in notebook.cells[1].source
  # ... and that extra names no TensorFlow (nor do its dependencies: BUILD_NOTES.md, "Notebooks").
  project = tomllib.loads((REPO / "pyproject.toml").read_text())
  extra = project["project"]["optional-dependencies"]["experiments"]
  names = [re.split(r"[<>=!~;\[ ]", requirement)[0].lower() for requirement in extra]
  assert not [n for n in names if n.startswith(("tensorflow-cpu", "tensorflow-gpu", "keras"))]
  assert "tensorflow" not in names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_executed_with_its_outputs(path):
  assert path.stat().st_size < MAX_STORED_BYTES, f"{path.name}: {path.stat().st_size} bytes"
  notebook = nbformat.read(path, as_version=4)
  problems = stored_problems(notebook)
  assert not problems, (
    f"{path.name} is not stored executed ({'; '.join(problems)}): "
    f"run `python tests/test_notebooks.py {path.stem}` and commit it"
  )


def test_a_notebook_without_outputs_is_caught():
  notebook = nbformat.read(NOTEBOOKS[0], as_version=4)
  assert stored_problems(notebook) == []
  for cell in _code_cells(notebook):
    cell.outputs, cell.execution_count = [], None
  problems = stored_problems(notebook)
  assert "code cell 1: execution count None, expected 1" in problems
  assert any(p.endswith("no figure") for p in problems), problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
  if (
    "omniglot" in path.stem
    and not (OMNIGLOT_DIR / "images_background.zip").exists()
    and not os.environ.get("OMNIGLOT_DIR")
  ):
    pytest.skip(f"Omniglot zips not found at {OMNIGLOT_DIR}; set OMNIGLOT_DIR")
  for name, value in _environment().items():
    monkeypatch.setenv(name, value)
  # The kernel starts as a user's does: without this suite's device count (conftest.py).
  monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
  notebook = execute(path, tmp_path)
  assert stored_problems(notebook, local_paths=False) == []
  # The stored figures are the code's: the same cells draw them.
  stored = nbformat.read(path, as_version=4)
  assert [_has_image(c) for c in _code_cells(notebook)] == [
    _has_image(c) for c in _code_cells(stored)
  ]


def _replace_in_outputs(notebook, replacements: dict[str, str]) -> None:
  """Rewrites local folders in the printed outputs, e.g. the Omniglot zips' as $OMNIGLOT_DIR."""
  for cell in _code_cells(notebook):
    for output in cell.outputs:
      for holder, key in ((output, "text"), (output.get("data", {}), "text/plain")):
        if isinstance(holder.get(key), str):
          for local, shown in replacements.items():
            holder[key] = holder[key].replace(local, shown)


def store(names: list[str]) -> None:
  """Executes the named notebooks (all by default) and writes them back with their outputs.

  The outputs name no local folder: the Omniglot zips' folder is written $OMNIGLOT_DIR,
  the home folder ~, and the kernel's temporary folder `.`.
  """
  os.environ.update(_environment())
  for path in NOTEBOOKS:
    if names and path.stem not in names:
      continue
    with tempfile.TemporaryDirectory() as folder:  # its runs/ goes with it
      notebook = execute(path, Path(folder))
    replacements = {}
    for local, shown in (
      (os.environ["OMNIGLOT_DIR"], "$OMNIGLOT_DIR"),
      (str(Path.home()), "~"),
      (folder, "."),
    ):
      replacements[str(Path(local).resolve())] = shown
      replacements[local] = shown
    _replace_in_outputs(notebook, replacements)
    problems = stored_problems(notebook)
    if problems:
      raise SystemExit(f"{path.name}: {'; '.join(problems)}")
    nbformat.write(notebook, path)
    print(f"{path.name}: stored, {path.stat().st_size} bytes")


if __name__ == "__main__":
  store(sys.argv[1:])
