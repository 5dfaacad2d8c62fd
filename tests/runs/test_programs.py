import json

import jax
import numpy as np
import pytest

import vampire_jax as vj
from experiments import presets, regression
from vampire_jax._src.metrics.evaluation import evaluate_split
from vampire_jax.runs import programs


@pytest.mark.parametrize("which", ["best", "final"])
def test_results_record_which_parameters_were_tested(tmp_path, which):
  config = presets.get_config("regression", "quick", "maml").replace(
    hidden_sizes=(8, 8, 8),
    tasks_per_step=2,
    num_meta_steps=6,
    meta_lr=0.3,  # large: validation gets worse after its best, so best and final differ
    num_val_tasks=4,
    num_test_tasks=4,
    eval_batch_tasks=2,
    eval_every=2,
    checkpoint_every=2,
    log_every=2,
    test_parameters=which,
  )
  problem = regression.make_problem(config)
  vj.train_and_evaluate(problem, config, tmp_path, progress=False, print_fn=lambda m: None)
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["test_parameters"] == which
  best_step = saved["best_validation"]["step"]
  assert best_step != 6  # the two choices differ here
  assert saved["tested_step"] == (6 if which == "final" else best_step)
  # Every validation records calibration, so ECE can be followed against steps.
  lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in lines if "val/ece" in m] == [2, 4, 6]
  # load_run gives the tested parameters: scored again on the test tasks, the same MSE.
  run = vj.load_run(tmp_path)
  test_key = jax.random.split(jax.random.key(config.seed), 4)[3]
  evaluate = programs.build_evaluator(problem.kind, problem.noise_std, config, run.learner)
  per_task = evaluate_split(
    programs.split_evaluator(problem, evaluate, "test"),
    run.meta_params,
    test_key,
    config.evaluation.num_test_tasks,
    programs.eval_batch_size(config),
  )
  assert float(np.mean(per_task["mse"])) == pytest.approx(saved["test"]["mse"], rel=1e-6)


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_a_classification_run_draws_each_task_inside_the_loop(monkeypatch, kind):
  # Images are gathered, the same one task at a time; a sine's values are not (they round by
  # vector width), so a regression run draws its batch first (`ProblemKind.draw_per_task`).
  from tests.helpers import _classification_problem, _regression_problem
  from vampire_jax._src.core import meta_step

  built = {}

  def capture(*args, **kwargs):
    built.update(kwargs)
    raise RuntimeError("captured")

  monkeypatch.setattr(meta_step, "make_train_step", capture)
  problem = _classification_problem(5) if kind == "classification" else _regression_problem()
  config = vj.RunConfig().replace(task_batching="map", tasks_per_step=4)
  with pytest.raises(RuntimeError, match="captured"):
    programs.build_train_step(problem, config, None, None, None, 1)
  assert built["task_batching"] == "map"
  assert built["draw_per_task"] is (kind == "classification")
