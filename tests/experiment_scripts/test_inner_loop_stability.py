"""Commands refuse what they cannot do in one line, before any work.

A regression comparison that names ProtoNet is refused before its first method trains;
`experiments.inner_loop_stability` refuses a folder that is no run, a run of another
experiment or of a learner without gradient inner steps, and a task count below 2;
`benchmarks.simpa_inner_loop` refuses seeds and KL draws it cannot use.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import inner_loop_stability, regression, zoo
from tests.helpers import _argparse_error
from vampire_jax._src.core.errors import ConfigError


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def test_inner_loop_stability_measures_curvature_against_the_supports_spread():
  """experiments.inner_loop_stability, on a linear model: its support loss
  0.5/sigma^2 * mean((w x + b - y)^2) has the Hessian [[m2, m1], [m1, 1]] / sigma^2 in
  (w, b), m_k the support's mean x^k, so lambda is known in closed form and grows with x^2."""
  from types import SimpleNamespace

  from experiments import inner_loop_stability as stability

  model = vj.MLP((), 1)  # y = w x + b
  params = jax.tree_util.tree_map(jnp.zeros_like, vj.init_params(model, jax.random.key(0), (1, 1)))
  learner = vj.maml(vj.pure_apply(model), vj.gaussian_nll(0.3), inner_lr=0.05, num_inner_steps=3)
  run = SimpleNamespace(learner=learner, meta_params=params, config=SimpleNamespace(num_mc_test=1))
  x = jnp.array([[0.1, 0.2, 0.3, 0.4, 0.5], [4.6, 4.7, 4.8, 4.9, 5.0]])[..., None]
  tasks = vj.Task(x, 2 * x, x, 2 * x)
  m = stability.task_measures(run, tasks, jax.random.key(1))
  m1, m2 = np.mean(np.asarray(x)[..., 0], axis=1), np.mean(np.asarray(x)[..., 0] ** 2, axis=1)
  largest = ((m2 + 1) + np.sqrt((m2 - 1) ** 2 + 4 * m1**2)) / 2 / 0.09
  np.testing.assert_allclose(m["curvature"], largest, rtol=1e-4)
  np.testing.assert_allclose(m["mean_x2"], m2, rtol=1e-6)
  np.testing.assert_allclose(m["step_factor"], 0.05 * largest, rtol=1e-4)
  # alpha * lambda: 0.6 near 0 (the loss falls), 13.5 near 5 (it rises and the task runs away).
  assert list(m["loss_rose"]) == [False, True] and list(m["ran_away"]) == [False, True]
  rows = stability.table(m)
  assert [(r["mean_x2"], r["tasks"], r["step_factor_above_2"]) for r in rows] == [
    ("[0, 2)", 1, 0),
    ("[15, 25)", 1, 1),
  ]


def test_inner_loop_stability_refuses_a_folder_that_is_no_run(tmp_path):
  """A folder without run.json is refused naming the folder and the run folders to give."""
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(tmp_path / "nothing")])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {tmp_path / 'nothing'} ")
  assert "is not a run folder (no run.json)" in message  # the cause
  assert "give run folders of experiments.regression" in message  # the fix
  assert "e.g. runs/regression_cpu_seed0/vampire" in message


def test_inner_loop_stability_refuses_a_run_of_another_experiment():
  """An Omniglot run is refused naming its config class and that a regression run is needed."""
  cell = zoo.ZOO / "omniglot_original_quick_protonet"
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(cell)])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {cell} ")
  assert "is a run of OmniglotConfig, not of experiments.regression" in message  # the cause
  assert "this tool draws sine/line tasks" in message and "give a regression run" in message


def test_inner_loop_stability_refuses_a_run_without_gradient_inner_steps(tmp_path, monkeypatch):
  """A SImPa run is refused naming its algorithm, the missing gradient inner step, and the
  algorithms that have one, before any task is drawn. A SImPa learner (no inner-loop
  settings) stands in for the trained run: what is refused is the learner's kind."""
  learner = vj.baselines.simpa(
    vj.pure_apply(vj.MLP((4,), 1)), vj.gaussian_nll(0.3), tasks_per_step=2, num_kl_samples=2
  )
  run = types.SimpleNamespace(config=regression.get_config("cpu", "simpa"), learner=learner)
  monkeypatch.setattr(vj, "load_run", lambda folder: run)
  (tmp_path / "run.json").write_text("{}")
  with pytest.raises(ConfigError) as raised:
    inner_loop_stability.main([str(tmp_path)])
  message = _one_line(raised)
  assert message.startswith(f"experiments.inner_loop_stability: {tmp_path} is a simpa run")
  assert "inner loop has no gradient step of a support loss to measure" in message  # the cause
  assert "give a run of vampire, vampire2, abml, maml, fomaml or platipus" in message  # the fix


@pytest.mark.parametrize("tasks", ["0", "-3", "some"])
def test_inner_loop_stability_refuses_too_few_tasks(capsys, tasks):
  """`--tasks` 0, -3 and 'some' are refused by argparse naming the least count, 2, and why."""
  line = _argparse_error(capsys, lambda: inner_loop_stability.main(["run", "--tasks", tasks]))
  assert line.endswith(
    f"argument --tasks: a count of test tasks of at least 2 (the summary's rank correlation "
    f"needs two), not {tasks!r}"
  )
