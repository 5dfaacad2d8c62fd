"""What a newcomer reads and runs says what it does, each checked where it is.

The README's `zoo verify` line and its progress bars, the note of a slow first prediction,
the figures' texts, the mutual information of a method without an epistemic part, what
`vj.Problem.model` takes, SImPa's cost before it starts, and the methods named where a
reader looks for them. (The README's training block's expected MSE: tests/test_readme.py;
`load_omniglot` logging: tests/test_omniglot_data.py; the API pages' examples:
tests/test_api_examples.py.)
"""

import re
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

import vampire_jax as vj
from conftest import REPO
from experiments import regression, train, zoo
from vampire_jax.runs import compile_note, kinds


def test_the_readmes_zoo_verify_command_names_omniglot_dir():
  lines = [line for line in (REPO / "README.md").read_text().splitlines() if "zoo verify" in line]
  assert lines and all("OMNIGLOT_DIR=" in line for line in lines), lines


def test_zoo_verify_draws_its_progress_bars_on_stderr_and_prints_its_table_alone(
  monkeypatch, capsys
):
  pytest.importorskip("tqdm")

  def verify_cell(zoo_dir, name, entry, num_tasks, machine):  # what verify_cell does, quickly
    with zoo._progress_bar(name, 3) as on_batch:
      for done in (1, 2, 3):
        on_batch(done, 3)
    return zoo.Verified(name, 3, False, "equal", "", "1", "1", 0.1)

  monkeypatch.setattr(zoo, "verify_cell", verify_cell)
  assert zoo.main(["verify", "--cells", "regression_cpu_maml", "--num-test-tasks", "3"]) == 0
  out, err = capsys.readouterr()
  assert "verifying regression_cpu_maml" in err and "verifying" not in out
  assert out.startswith("| cell | paper | trained (device, commit) | verified here (")
  assert all(
    line.startswith("|") or not line or "cells verified" in line for line in out.splitlines()
  )


# -- The first prediction of a process --------------------------------------------------------


@pytest.fixture
def fresh_process(monkeypatch):
  """compile_note as in a process that has predicted nothing yet, noting after 0.05 s."""
  monkeypatch.setattr(compile_note, "_first_call", threading.Event())
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 0.05)


def test_a_slow_first_prediction_says_it_is_compiling_once(fresh_process, capsys):
  slow = lambda x: time.sleep(0.3) or x  # noqa: E731
  assert compile_note.noting_a_slow_first_call(slow, 1) == 1
  assert capsys.readouterr().err == compile_note.NOTE + "\n"
  assert compile_note.noting_a_slow_first_call(slow, 2) == 2  # once per process
  assert capsys.readouterr().err == ""


def test_a_quick_first_prediction_says_nothing(fresh_process, monkeypatch, capsys):
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 2.0)
  assert compile_note.noting_a_slow_first_call(lambda: 7) == 7
  time.sleep(0.05)
  assert capsys.readouterr().err == ""


def test_run_predict_goes_through_the_note(fresh_process, monkeypatch, capsys):
  monkeypatch.setattr(compile_note, "NOTE_AFTER_S", 0.0)  # whatever the call takes
  run = vj.load_run(zoo.ZOO / "regression_cpu_maml")
  x = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]
  assert run.predict(x, np.sin(x), x, jax.random.key(0)).shape == (1, 5, 1)
  assert compile_note.NOTE in capsys.readouterr().err


# -- The figures' texts -------------------------------------------------------------------------


def test_the_regression_calibration_figure_is_named_by_its_metric():
  """Its MAML at 0.132 is the PIT calibration of the time; today's `ece`, the paper's, puts
  MAML at its 0.274 floor: the text beside the figure says which is which."""
  text = (REPO / "docs" / "fidelity.md").read_text()
  start = text.index("`docs/regression_calibration.png`")
  beside = " ".join(text[start : start + 900].split())
  assert "`pit_ece`; MAML 0.132 in the figure" in beside and "3/11" in beside
  assert "vj.paper_quantile_calibration" in beside and "0.274" in beside


def test_the_omniglot_quick_figures_are_said_to_be_the_zoo_cells_and_show_its_numbers():
  row = next(
    line for line in (REPO / "docs" / "reliability.md").read_text().splitlines()
    if line.startswith("| `omniglot_quick_reliability.png`")
  )  # fmt: skip
  entry = zoo.read_manifest(zoo.ZOO)["cells"]["omniglot_original_quick_vampire"]
  test = entry["test"]
  assert "zoo/omniglot_original_quick_vampire" in row and "plots.run_figures" in row
  shown = f"{100 * test['accuracy']:.2f} ± {100 * test['accuracy_ci95']:.2f} %, ECE "
  assert shown + f"{test['ece']:.3f}, MCE {test['mce']:.3f}" in row


# -- A method without an epistemic part -------------------------------------------------------


def test_the_test_line_says_n_a_for_the_mutual_information_of_a_point_estimate():
  targets = np.array([[0, 1, -1, -1]])
  per_task = {
    "targets": targets,
    "max_prob": np.array([[0.9, 0.8, 0.6, 0.5]]),
    "entropy": np.array([[0.1, 0.2, 0.4, 0.5]]),
    "mutual_information": np.zeros((1, 4)),  # one weight draw: MAML, ProtoNet
    "correct": np.array([[True, True, False, False]]),
  }
  open_set = vj.open_set_summary(per_task)
  test = dict(accuracy=1.0, accuracy_ci95=0.0, nll=0.1, ece=0.0, mce=0.0, aurc=0.0, num_tasks=1)
  line = vj.test_summary_line(dict(test, open_set=open_set))
  assert line.endswith("open-set AUROC (max prob / MI) 1.000 / n/a  (1 tasks)")
  assert kinds.auroc_text(open_set, "mutual_information", "misclassification_auroc") == "n/a"


# -- What vj.Problem.model takes ---------------------------------------------------------------


def test_a_problem_of_an_nnx_network_is_refused_saying_the_loop_takes_linen(tmp_path):
  config = regression.get_config("quick", "maml")
  problem = regression.make_problem(config)._replace(model=nnx.Linear(1, 1, rngs=nnx.Rngs(0)))
  with pytest.raises(vj.InputError) as error:
    vj.train_and_evaluate(problem, config, tmp_path / "run", progress=False)
  message = str(error.value)
  assert "problem.model" in message and "flax.linen module" in message
  assert "vj.from_nnx" in message and "vj.make_train_step" in message
  assert not (tmp_path / "run").exists()
  assert "linen" in vj.Problem.__doc__.split("input_shape:")[0]


# -- SImPa's cost, before it starts ------------------------------------------------------------


def test_simpas_cost_note_gives_the_measured_seconds_at_512_and_16_draws():
  config = regression.get_config("cpu", "simpa")
  at_512 = train.simpa_cost_note(config, 20501)  # the regression preset's MLP
  assert "512 draws" in at_512 and "about 98 s a meta-step" in at_512 and "81.7 h" in at_512
  at_16 = train.simpa_cost_note(config.replace(num_kl_samples=16), 20501)
  assert "about 13.6 s a meta-step" in at_16


def test_a_simpa_run_prints_its_cost_once_its_network_is_known():
  config = regression.get_config("cpu", "simpa")
  printed = []
  problem = train.with_simpa_cost_note(
    lambda: regression.make_problem(config), config, printed.append
  )()
  assert isinstance(problem, vj.Problem)
  (note,) = printed
  assert re.search(r"network has 20,501 weights: about 98 s a meta-step", note), note


# -- Vampire2, ProtoNet and SImPa, where a reader looks ---------------------------------------


@pytest.mark.parametrize("page", ["README.md", "docs/experiments.md", "docs/reproducing.md"])
def test_the_authors_later_algorithms_are_named_with_which_method_when(page):
  text = (REPO / page).read_text()
  assert all(name in text for name in ("Vampire2", "ProtoNet", "SImPa")), page
  assert "which method when" in text.lower()


def test_the_which_method_when_table_says_what_each_models_costs_and_its_uncertainty():
  text = (REPO / "docs" / "experiments.md").read_text()
  table = text[text.index("### Which method when") :].split("\n\n")[2].splitlines()
  assert (
    table[0].startswith("| method | what it models | cost per step") and "uncertainty" in table[0]
  )
  methods = [row.split("|")[1] for row in table[2:]]
  for name in ("VAMPIRE", "Vampire2", "MAML", "ProtoNet", "SImPa"):
    assert any(name in m for m in methods), name
