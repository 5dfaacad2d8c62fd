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
