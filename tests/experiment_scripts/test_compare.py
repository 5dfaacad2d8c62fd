"""The comparison command: every algorithm through the training loop, joint figures and table."""

import json
import re
import shutil
import types

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, compare, regression
from tests.conftest import OMNIGLOT_DIR, TINY_REGRESSION, needs_omniglot
from vampire_jax._src.core.errors import ConfigError
from vampire_jax._src.metrics import calibration


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _summary(ece_shift: float) -> dict:
  levels = np.linspace(0.1, 0.9, 9)
  curve = calibration.QuantileCalibration(levels, levels + ece_shift, ece_shift, ece_shift)
  return {
    "mse": 2.0 + ece_shift,
    "mse_ci95": 0.1,
    "mse_median": 1.5,
    "num_ran_away": 0,
    "nll": 3.0,
    "ece": ece_shift,
    "mce": ece_shift,
    "num_tasks": 10,
    "wall_time_s": {"train": 12.0},
    "calibration": {"quantile_calibration": calibration.to_record(curve)},
  }


def test_a_comparison_drops_what_a_method_ignores_and_says_so(tmp_path, monkeypatch, capsys):
  trained = {}

  def fake_train(config, workdir, progress=True):
    trained[config.algorithm.name] = config
    return {
      "test": {"mse": 1.0},
      "kind": "regression",
      "wall_time_s": {},
      "calibration": {},
      "config": config.flat(),
    }

  monkeypatch.setattr(regression, "run_experiment", fake_train)
  compare.run_methods(
    regression, ["vampire", "maml"], "quick", tmp_path, {"kl_weight": 0.5}, progress=False
  )
  assert trained["vampire"].algorithm.kl_weight == 0.5
  assert "kl_weight" not in trained["maml"].flat()
  assert (
    "note: --algorithm maml ignores --kl-weight 0.5 (an option of vampire, platipus, abml, "
    "vampire2); not applied" in capsys.readouterr().out
  )


def test_a_method_named_twice_is_refused():
  """compare --algorithms naming vampire twice is refused; distinct methods are parsed."""
  from experiments import compare

  with pytest.raises(ConfigError, match="--algorithms names vampire twice"):
    compare.parse_algorithms("vampire,maml,vampire")
  assert compare.parse_algorithms("vampire,maml") == ["vampire", "maml"]


def test_a_comparison_naming_protonet_is_refused_before_any_method_trains(tmp_path):
  """A regression comparison naming ProtoNet (which classifies) is refused in one line,
  naming the algorithm, why, the experiments it needs and the config it got, before any
  method trains or the comparison's folder is made; the command says it by its flags."""
  trained = []
  experiment = types.SimpleNamespace(
    get_config=regression.get_config,
    run_experiment=lambda config, workdir, progress: trained.append(config.algorithm.name) or {},
  )
  with pytest.raises(ConfigError) as raised:
    compare.run_methods(experiment, ["maml", "protonet"], "quick", tmp_path / "runs", {}, False)
  message = _one_line(raised)
  assert message.startswith(
    "algorithm protonet classifies (its logits are distances to class prototypes): it needs "
  ), message
  assert "a classification experiment's config (omniglot, mini_imagenet, tiered_imagenet)" in (
    message
  )
  assert "not a RegressionConfig" in message
  assert str(cli.as_flags(raised.value)).startswith("--algorithm protonet classifies")
  assert trained == [] and not (tmp_path / "runs").exists()


def test_write_comparison_table_and_figures(tmp_path):
  written = compare.write_comparison(
    {"maml": _summary(0.1), "vampire": _summary(0.02)}, "regression", tmp_path, "test"
  )
  rows = written["table"].splitlines()
  assert rows[0] == "| method | MSE | median MSE | ran away | NLL | ECE | MCE | train time (s) |"
  assert rows[2] == "| maml | 2.100 ± 0.100 | 1.5000 | 0 | 3.0000 | 0.1000 | 0.1000 | 12 |"
  assert rows[3].startswith("| vampire | 2.020 ± 0.100 |")
  for name in ("comparison.png", "calibration_bars.png"):
    assert (tmp_path / name).stat().st_size > 5000
  assert written["table"] in (tmp_path / "results.md").read_text()


def test_diverged_method_is_a_table_row_and_left_out_of_the_figures(tmp_path):
  message = "meta-training diverged at step 140: {'train/loss': nan}"
  written = compare.write_comparison(
    {"fomaml": {"diverged": message}, "vampire": _summary(0.02)}, "regression", tmp_path, "test"
  )
  rows = written["table"].splitlines()
  assert rows[2] == f"| fomaml | {message} | | | | | | |"
  assert rows[3].startswith("| vampire | 2.020 ± 0.100 |")
  assert (tmp_path / "calibration_bars.png").stat().st_size > 5000


def test_every_method_diverging_is_an_error(tmp_path):
  overrides = dict(
    num_meta_steps=2,
    hidden_sizes=(8,),
    num_test_tasks=10,
    num_val_tasks=10,
    eval_batch_tasks=10,
    eval_every=2,
    checkpoint_every=2,
    log_every=1,
    tasks_per_step=2,
    inner_lr=1e30,
  )
  with pytest.raises(FloatingPointError, match="every method diverged"):
    compare.run("regression", ("maml",), "quick", tmp_path, overrides, progress=False)


@pytest.mark.parametrize(
  "algorithms",
  [
    ("platipus", "bmaml", "abml"),  # MAML, VAMPIRE: tests/experiment_scripts/test_regression.py
    pytest.param(compare.ALGORITHMS, marks=pytest.mark.slow),
  ],
)
def test_algorithms_train_through_the_loop_and_load_back(tmp_path, algorithms):
  # A few meta-steps per algorithm on a tiny MLP: each must plug into the
  # loop (meta-step, evaluation, checkpoint, calibration record) unchanged,
  # and load back with vj.load_run.
  overrides = dict(TINY_REGRESSION, hidden_sizes=(8, 8, 8), num_particles=2)
  results = compare.run("regression", algorithms, "quick", tmp_path, overrides, progress=False)
  assert list(results["methods"]) == list(algorithms)
  x = np.linspace(-4, 4, 5, dtype=np.float32)[:, None]
  for name, method in results["methods"].items():
    # The summary is the mean of the per-task scores the run saved.
    per_task = np.load(tmp_path / name / "test_per_task.npz")
    np.testing.assert_allclose(method["mse"], per_task["mse"].mean(), rtol=1e-6)
    run = vj.load_run(tmp_path / name)
    # --num-particles acts for BMAML only; the others' specs have no such field, and their
    # runs do not record it (issue 31).
    assert run.config.algorithm.name == name
    particles = run.config.flat().get("num_particles")
    assert particles == (2 if name == "bmaml" else None), name
    samples = run.predict(x, np.sin(x), x, jax.random.key(0))
    members = {"bmaml": 2, "maml": 1, "fomaml": 1}.get(name, 3)  # particles, a point, or draws
    assert samples.shape == (members, 5, 1) and np.all(np.isfinite(samples)), name
  saved = json.loads((tmp_path / "comparison.json").read_text())
  assert len(saved["table"].splitlines()) == 2 + len(algorithms)


def test_cli_errors():
  with pytest.raises(ConfigError, match="nonsense"):
    compare.parse_args(["--algorithms", "maml,nonsense"])
  benchmark, algorithms, preset, _, overrides, _ = compare.parse_args(
    ["--benchmark", "omniglot", "--algorithms", "maml,abml", "--num-meta-steps", "7"]
  )
  assert (benchmark, algorithms, preset, overrides.num_meta_steps) == (
    "omniglot",
    ["maml", "abml"],
    "5way1shot",
    7,
  )


def test_every_experiment_keeps_the_kl_term_of_variational_methods_only():
  from experiments import mini_imagenet, omniglot, regression, tiered_imagenet

  for module in (omniglot, mini_imagenet, tiered_imagenet):
    for algorithm in ("vampire", "platipus", "abml"):
      spec = module.get_config("5way1shot", algorithm).algorithm
      assert spec.has_kl and spec.kl_weight == 0.1, (module, algorithm)
    for algorithm in ("maml", "fomaml", "bmaml"):
      # A point estimate or particles: no KL term, and no kl_weight in its config.
      config = module.get_config("5way1shot", algorithm)
      assert not config.algorithm.has_kl, (module, algorithm)
      assert "kl_weight" not in config.flat(), (module, algorithm)
    with pytest.raises(ValueError, match="is unknown"):
      module.get_config("5way1shot", "nonsense")
  assert regression.get_config("cpu", "abml").algorithm.kl_weight == 1.0


@pytest.mark.slow  # two Omniglot runs with open-set episodes and figures
@needs_omniglot
def test_tiny_omniglot_comparison_sets_the_open_set_aurocs_side_by_side(omniglot_cache, tmp_path):
  # MAML (a point estimate) and VAMPIRE, a few meta-steps each: both get open-set episodes,
  # MAML's row shows its zero epistemic uncertainty (MI AUROC exactly 0.5), and the ROC
  # figure has a panel per method.
  overrides = dict(
    num_filters=4,
    num_inner_steps=1,
    tasks_per_step=2,
    num_meta_steps=2,
    num_val_tasks=2,
    num_test_tasks=4,
    eval_batch_tasks=2,
    eval_every=2,
    checkpoint_every=2,
    log_every=1,
    num_mc_test=3,
    query=3,
    num_open_set_classes=2,
    data_dir=str(OMNIGLOT_DIR),
    cache_dir=str(omniglot_cache),
  )
  results = compare.run(
    "omniglot", ("maml", "vampire"), "quick", tmp_path, overrides, progress=False
  )
  maml, vampire = (results["methods"][name]["open_set"] for name in ("maml", "vampire"))
  assert maml["auroc"]["mutual_information"] is None  # not applicable (issue 59), not 0.5
  assert maml["misclassification_auroc"]["mutual_information"] is None
  assert "mutual_information" in maml["not_applicable"]
  assert vampire["auroc"]["mutual_information"] != 0.5
  assert (vampire["num_unknown_classes"], vampire["num_unknown_queries"]) == (2, 4 * 2 * 3)
  rows = results["open_set_table"].splitlines()
  assert rows[0].startswith(
    "| method | open-set AUROC: max prob | open-set AUROC: entropy | open-set AUROC: MI |"
  )
  assert rows[2].startswith("| maml (point estimate: MI = 0) | ")
  assert rows[2].split(" | ")[3] == "n/a"
  assert rows[3].startswith(f"| vampire | {vampire['auroc']['max_prob']:.3f} | ")
  assert "Open-set and misclassification detection" in (tmp_path / "results.md").read_text()
  assert (tmp_path / "open_set_roc.png").stat().st_size > 5000
  saved = json.loads((tmp_path / "comparison.json").read_text())
  assert saved["methods"]["vampire"]["open_set"]["auroc"] == vampire["auroc"]


def test_init_from_a_comparison_without_a_methods_run_is_refused_before_any_trains(
  tmp_path, monkeypatch, capsys
):
  """`--algorithms vampire,maml --init-from C`, C a comparison holding only `vampire/`: refused
  in one line before VAMPIRE trains, naming the method without a source (the cause), the runs
  C holds, and the way out; so is a folder that holds no run at all."""
  from pathlib import Path

  from experiments import cli, regression

  zoo_vampire = Path(__file__).resolve().parents[2] / "zoo" / "regression_cpu_vampire"
  source = tmp_path / "source"
  (source / "vampire").mkdir(parents=True)
  shutil.copy2(zoo_vampire / "run.json", source / "vampire" / "run.json")  # a record only
  (tmp_path / "empty").mkdir()

  def trains(*args, **kwargs):
    pytest.fail("a method trained before every method's source was checked")

  monkeypatch.setattr(regression, "run_experiment", trains)
  flags = ["--preset", "quick", "--algorithms", "vampire,maml", "--no-compilation-cache"]
  workdir = ["--workdir", str(tmp_path / "c")]
  for folder, method, holds in (
    (source, "maml", r"its runs: vampire\b"),
    (tmp_path / "empty", "vampire", "it holds none"),  # the first method's source, then
  ):
    assert cli.main_entry(regression.main, flags + ["--init-from", str(folder)] + workdir) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --init-from: {folder} ")  # the flag, said as a flag
    assert f"holds no {method} run" in line and re.search(holds, line), line  # the cause
    assert f"give {method} a source of its own, or leave it out of --algorithms" in line  # fix
    assert not (tmp_path / "c" / "vampire").exists()
