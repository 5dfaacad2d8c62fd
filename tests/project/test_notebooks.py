"""The notebooks: stored with their outputs, and executed top to bottom as CI does.

The stored notebooks are read as committed: every code cell executed once, in order, with
its outputs (figures inline) and no error. CI then executes each from a temporary copy
(the committed file is never rewritten), in a fresh kernel in a temporary folder, with
VAMPIRE_JAX_SMALL=1 and OMNIGLOT_DIR pointing at ../shared/data/omniglot when present. A
cell that raises fails the test, so does a notebook that runs past its time limit.

After changing a notebook, store it again with its outputs (from the repository's root):

    python tests/project/test_notebooks.py                      # all three
    python tests/project/test_notebooks.py 01_quickstart_regression
"""

import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib

nbformat = pytest.importorskip("nbformat")


nbclient = pytest.importorskip("nbclient")


REPO = Path(__file__).resolve().parents[2]


NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


OMNIGLOT_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "omniglot"


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


# Predicting 0 everywhere scores an MSE of about 16.2 on sine/line tasks (E[y^2]: a line's
# 3 * 25/3 + 3 and a sinusoid's E[A^2]/2 = 4.25, averaged, plus the noise's 0.09): a trained
# method's test MSE is below that, and a mean far above it comes from tasks that ran away.
ZERO_PREDICTOR_MSE = 16.2


_MSE_ROW = re.compile(
  r"^(maml|bmaml|vampire)\s+([-+.\deinaf]+) ± ([-+.\deinaf]+)\s+median ([-+.\deinaf]+)"
  r"\s+ran away (\d+)/(\d+)",
  re.M,
)


_DIFFERENCE = re.compile(r"VAMPIRE's MSE is ([-+][\d.]+) from MAML's and ([-+][\d.]+) from BMAML's")


def printed_number_problems(notebook) -> list[str]:
  """What is wrong with the numbers notebook 01 prints: [] when they tell its story.

  Each method's test MSE (mean and median) is finite and below `ZERO_PREDICTOR_MSE`, no
  task ran away, and the sentence's differences are those of the printed means.
  """
  text = "".join(_output_text(cell) for cell in _code_cells(notebook))
  rows = {m[1]: m for m in _MSE_ROW.finditer(text)}
  if set(rows) != {"maml", "bmaml", "vampire"}:
    return [f"the MSE table: rows for {sorted(rows)}, expected maml, bmaml, vampire"]
  problems = []
  mse = {}
  for method, row in rows.items():
    mean, median, ran_away = float(row[2]), float(row[4]), int(row[5])
    mse[method] = mean
    if not (math.isfinite(mean) and 0 < median <= mean < ZERO_PREDICTOR_MSE):
      problems.append(
        f"{method}: MSE {row[2]} (median {row[4]}), not in (0, {ZERO_PREDICTOR_MSE}), what "
        "predicting 0 everywhere scores"
      )
    if ran_away:
      problems.append(f"{method}: {ran_away} of {row[6]} test tasks ran away")
  sentence = _DIFFERENCE.search(text)
  if not sentence:
    return problems + ["no sentence comparing VAMPIRE's MSE with MAML's and BMAML's"]
  for printed, other in zip(sentence.groups(), ("maml", "bmaml")):
    if abs(float(printed) - (mse["vampire"] - mse[other])) > 0.006:
      problems.append(
        f"VAMPIRE's MSE is {printed} from {other}'s, but the table gives "
        f"{mse['vampire']} - {mse[other]}"
      )
  return problems


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
    if path.stem.startswith("01_"):
      problems += printed_number_problems(notebook)
    if problems:
      raise SystemExit(f"{path.name}: {'; '.join(problems)}")
    nbformat.write(notebook, path)
    print(f"{path.name}: stored, {path.stat().st_size} bytes")


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
    f"run `python tests/project/test_notebooks.py {path.stem}` and commit it"
  )


def test_a_notebook_without_outputs_is_caught():
  notebook = nbformat.read(NOTEBOOKS[0], as_version=4)
  assert stored_problems(notebook) == []
  for cell in _code_cells(notebook):
    cell.outputs, cell.execution_count = [], None
  problems = stored_problems(notebook)
  assert "code cell 1: execution count None, expected 1" in problems
  assert any(p.endswith("no figure") for p in problems), problems


def test_notebook_01_prints_sane_numbers():
  """Notebook 01's stored outputs print each method's MSE finite and below what predicting 0
  scores, no task run away, and a sentence whose differences are the printed means'."""
  notebook = nbformat.read(REPO / "notebooks" / "01_quickstart_regression.ipynb", as_version=4)
  assert printed_number_problems(notebook) == []


def test_the_number_check_catches_a_runaway_mean():
  notebook = nbformat.read(REPO / "notebooks" / "01_quickstart_regression.ipynb", as_version=4)
  cell = next(c for c in _code_cells(notebook) if "VAMPIRE's MSE is" in c.source)
  (output,) = [o for o in cell.outputs if o.output_type == "stream"]
  table = _MSE_ROW.search(output.text)
  maml = next(m for m in _MSE_ROW.finditer(output.text) if m[1] == "maml")
  output.text = output.text.replace(maml[0], maml[0].replace(maml[2], "125030728529349.906", 1))
  problems = printed_number_problems(notebook)
  assert table and any(p.startswith("maml: MSE 125030728529349.906 (median") for p in problems)
  assert any("but the table gives" in p for p in problems)  # the sentence's difference


@pytest.mark.slow  # each notebook runs top to bottom in a kernel: minutes
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
  if path.stem.startswith("01_"):  # what it prints tells its story on this machine too
    assert printed_number_problems(notebook) == []
  # The stored figures are the code's: the same cells draw them.
  stored = nbformat.read(path, as_version=4)
  assert [_has_image(c) for c in _code_cells(notebook)] == [
    _has_image(c) for c in _code_cells(stored)
  ]


if __name__ == "__main__":
  store(sys.argv[1:])
