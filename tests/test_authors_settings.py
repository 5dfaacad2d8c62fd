"""The authors' 2019 settings (issue 29): the log-std weight decay, separate clipping, the
tested parameters, the data's noise, the query grid, the initial gain, and the
`authors2019` presets against docs/fidelity.md's tables."""

import ast
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core.meta_step import log_std_mask
from vampire_jax._src.metrics.evaluation import evaluate_split
from vampire_jax.runs import programs
from experiments import presets, regression
from vampire_jax.baselines.platipus import PlatipusParams

REPO = Path(__file__).resolve().parents[1]


def _gaussian(seed: int = 0) -> vj.Gaussian:
  keys = jax.random.split(jax.random.key(seed), 4)
  mean = {"w": jax.random.normal(keys[0], (3, 2)), "b": jax.random.normal(keys[1], (2,))}
  log_std = {
    "w": jax.random.uniform(keys[2], (3, 2), minval=-4.0, maxval=-3.0),
    "b": jax.random.uniform(keys[3], (2,), minval=-4.0, maxval=-3.0),
  }
  return vj.Gaussian(mean, log_std)


def test_log_std_mask_marks_log_stds_only():
  prior = _gaussian()
  assert log_std_mask(prior) == vj.Gaussian({"w": False, "b": False}, {"w": True, "b": True})
  platipus = PlatipusParams(prior.mean, prior.log_std, prior.log_std, prior.mean, prior.mean)
  mask = log_std_mask(platipus)
  assert (
    jax.tree_util.tree_leaves(mask.log_std) + jax.tree_util.tree_leaves(mask.log_std_q)
    == [True] * 4
  )
  others = (mask.mean, mask.log_step_p, mask.log_step_q)  # the step sizes are no log-stds
  assert not any(jax.tree_util.tree_leaves(others))
  assert not any(jax.tree_util.tree_leaves(log_std_mask(prior.mean)))  # MAML: none


def test_weight_decay_with_zero_gradient_widens_the_log_stds_and_leaves_the_means():
  # With a zero meta-gradient the only gradient is the decay's lambda * rho: Adam's
  # first step moves each log-std by lr * g / (|g| + eps) toward 0, each mean by nothing.
  prior, lr, decay = _gaussian(), 1e-3, 1e-3
  optimizer = vj.meta_optimizer(
    lr, tasks_per_step=10, decay_rate=1.0, clip_norm=10.0, log_std_weight_decay=decay
  )
  zeros = jax.tree_util.tree_map(jnp.zeros_like, prior)
  updates, _ = optimizer.update(zeros, optimizer.init(prior), prior)
  after = vj.Gaussian(*jax.tree_util.tree_map(jnp.add, prior, updates))
  for rho, rho_after in zip(
    jax.tree_util.tree_leaves(prior.log_std), jax.tree_util.tree_leaves(after.log_std)
  ):
    gradient = decay * np.asarray(rho, np.float64)
    expected = np.asarray(rho, np.float64) - lr * gradient / (np.abs(gradient) + 1e-8)
    np.testing.assert_allclose(rho_after, expected, rtol=1e-6)
    assert np.all(np.asarray(rho_after) > np.asarray(rho))  # toward 0: a wider prior
  for mu, mu_after in zip(
    jax.tree_util.tree_leaves(prior.mean), jax.tree_util.tree_leaves(after.mean)
  ):
    np.testing.assert_array_equal(mu_after, mu)


def _torch_adam_reference(params, gradients, *, lr, decay, clip_norm, separately):
  """PyTorch's Adam with `weight_decay` on the log-stds' parameter group, after clipping
  (the authors' vampire.py), written out in float64 for a `Gaussian` of arrays."""
  mean = {k: np.asarray(v, np.float64) for k, v in params.mean.items()}
  log_std = {k: np.asarray(v, np.float64) for k, v in params.log_std.items()}
  state = {
    name: {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in group.items()}
    for name, group in (("mean", mean), ("log_std", log_std))
  }

  def clip(groups):
    norm = math.sqrt(sum(float(np.sum(g**2)) for group in groups for g in group.values()))
    scale = min(1.0, clip_norm / norm)
    return [{k: g * scale for k, g in group.items()} for group in groups]

  for t, grad in enumerate(gradients, start=1):
    g_mean = {k: np.asarray(v, np.float64) for k, v in grad.mean.items()}
    g_log_std = {k: np.asarray(v, np.float64) for k, v in grad.log_std.items()}
    if separately:
      (g_mean,), (g_log_std,) = clip([g_mean]), clip([g_log_std])
    else:
      g_mean, g_log_std = clip([g_mean, g_log_std])
    g_log_std = {k: g + decay * log_std[k] for k, g in g_log_std.items()}  # torch's L2
    for name, group, g_group in (("mean", mean, g_mean), ("log_std", log_std, g_log_std)):
      for k in group:
        m, v = state[name][k]
        m = 0.9 * m + 0.1 * g_group[k]
        v = 0.999 * v + 0.001 * g_group[k] ** 2
        state[name][k] = (m, v)
        group[k] = group[k] - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
  return vj.Gaussian(mean, log_std)


@pytest.mark.parametrize("separately", [True, False])
def test_meta_optimizer_is_the_authors_torch_adam_step_by_step(separately):
  # Gradients whose means part is 2.5x the log-stds', both above the clip: separate and joint clipping
  # differ, and the decay is added after the clip (before it, the clip would shrink it).
  prior = _gaussian(1)
  keys = jax.random.split(jax.random.key(2), 8)
  gradients = [
    vj.Gaussian(
      jax.tree_util.tree_map(lambda x, k=k: 50.0 * jax.random.normal(k, x.shape), prior.mean),
      jax.tree_util.tree_map(
        lambda x, k=k: 20.0 * jax.random.normal(jax.random.fold_in(k, 1), x.shape), prior.log_std
      ),
    )
    for k in keys[:4]
  ]
  optimizer = vj.meta_optimizer(
    1e-2,
    tasks_per_step=10,
    decay_rate=1.0,
    clip_norm=10.0,
    clip_separately=separately,
    log_std_weight_decay=0.5,  # large, so that an error in its place shows
  )
  params, state = prior, optimizer.init(prior)
  for grad in gradients:
    updates, state = optimizer.update(grad, state, params)
    params = jax.tree_util.tree_map(jnp.add, params, updates)
  expected = _torch_adam_reference(
    prior, gradients, lr=1e-2, decay=0.5, clip_norm=10.0, separately=separately
  )
  for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
  # And the two clippings do differ here (the test could tell them apart).
  other = _torch_adam_reference(
    prior, gradients, lr=1e-2, decay=0.5, clip_norm=10.0, separately=not separately
  )
  assert (
    max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(other))
    )
    > 1e-3
  )


@pytest.mark.parametrize(
  "kwargs, argument",
  [
    ({"learning_rate": -1e-3}, "learning_rate"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"tasks_per_step": 0}, "tasks_per_step"),
    ({"tasks_per_step": 2.5}, "tasks_per_step"),
    ({"log_std_weight_decay": -1.0}, "log_std_weight_decay"),
    ({"clip_norm": 0.0}, "clip_norm"),
    ({"decay_rate": 1.5}, "decay_rate"),
  ],
)
def test_meta_optimizer_refuses_settings_outside_their_meaning(kwargs, argument):
  settings = dict(learning_rate=1e-3, tasks_per_step=10, **{})
  settings.update(kwargs)
  learning_rate = settings.pop("learning_rate")
  with pytest.raises(vj.InputError, match=f"meta_optimizer|meta_lr_schedule.*{argument}"):
    vj.meta_optimizer(learning_rate, **settings)


# -- The presets -----------------------------------------------------------------------


def _build_notes_table(title: str, page: str = "BUILD_NOTES.md") -> dict[str, object]:
  """`{config field: value}` of the authors2019 column of the table `title` in `page`.

  Each row names its field in backticks in the first cell; the last cell starts
  with the authors2019 preset's value, a Python literal in backticks.
  """
  text = (REPO / page).read_text()
  start = text.index(title)
  rows = {}
  for line in text[start:].splitlines()[1:]:
    if rows and not line.startswith("|"):
      break
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    field = re.match(r".*?`([a-z_0-9]+)`", cells[0]) if len(cells) == 5 else None
    value = re.match(r"`([^`]*)`", cells[-1]) if field else None
    if field and value:
      rows[field.group(1)] = ast.literal_eval(value.group(1))
  return rows


@pytest.mark.parametrize(
  "experiment, title, page",
  [
    ("regression", "Regression (Fig. 2, Table 6), VAMPIRE:", "docs/fidelity.md"),
    ("mini_imagenet", "mini-ImageNet 5-way 1-shot (Table 2, Fig. 4), VAMPIRE:", "docs/fidelity.md"),
  ],
)
def test_authors2019_presets_are_the_build_notes_table(experiment, title, page):
  table = _build_notes_table(title, page)
  assert len(table) >= 15, table  # one row per setting
  config = presets.get_config(experiment, "authors2019", "vampire")
  config.validate()
  settings = config.flat()  # every part's fields and the spec's, by name
  for field, value in table.items():
    got = settings[field]
    got = list(got) if isinstance(got, tuple) else got
    value = list(value) if isinstance(value, tuple) else value
    assert got == pytest.approx(value) if isinstance(value, float) else got == value, field


def _log_std_settings(config) -> tuple[bool, float]:
  """`(meta_grad_clip_separately, log_std_weight_decay)` of the config's algorithm; one without
  log-stds (MAML, BMAML) takes neither, which is (False, 0.0): no separate clipping, no decay."""
  spec = config.algorithm
  taken = {"meta_grad_clip_separately", "log_std_weight_decay"} & set(spec.field_names())
  assert taken in (set(), {"meta_grad_clip_separately", "log_std_weight_decay"}), spec
  if not taken:
    return False, 0.0
  return spec.meta_grad_clip_separately, spec.log_std_weight_decay


def test_authors2019_regression_per_method():
  for name, (draws, clip, separately, decay, steps) in presets.AUTHORS2019_REGRESSION.items():
    config = presets.get_config("regression", "authors2019", name)
    config.validate()
    assert config.data_noise_std == 0.09 and config.noise_std == 0.3
    assert config.likelihood_std == pytest.approx(math.sqrt(0.5))  # the MSE
    assert (config.evaluation.test_parameters, config.test_query_grid, config.num_query) == (
      "final",
      100,
      15,
    )
    assert config.schedule.meta_grad_clip_norm == clip
    assert _log_std_settings(config) == (separately, decay)
    assert config.schedule.num_meta_steps == steps
    if name in ("vampire", "platipus", "abml"):
      assert config.algorithm.num_mc_train == config.algorithm.num_mc_query == draws
  with pytest.raises(vj.ConfigError, match="authors2019"):
    presets.get_config("mini_imagenet", "authors2019", "maml")


def test_paper_presets_follow_the_code_where_the_text_is_silent():
  for experiment, preset in (
    ("regression", "cpu"),
    ("regression", "paper"),
    ("omniglot", "5way1shot"),
  ):
    for algorithm in ("vampire", "maml", "platipus"):
      config = presets.get_config(experiment, preset, algorithm)
      assert config.evaluation.test_parameters == "final" and config.kernel_init_gain == 1.0
      # Omniglot's presets leave the decay out: it stalled the 5-way 1-shot preset on a GPU.
      carries_decay = algorithm == "vampire" and experiment != "omniglot"
      assert _log_std_settings(config) == (algorithm == "vampire", 1e-3 if carries_decay else 0.0)
      # ...and the text where the two disagree: the decay of gamma, no truncation (PLATIPUS
      # has no such option: it differentiates every step).
      assert config.schedule.meta_lr_decay == 0.99
      assert getattr(config.algorithm, "second_order_steps", None) is None
  quick = presets.get_config("omniglot", "quick", "vampire")
  assert (quick.evaluation.test_parameters, quick.algorithm.log_std_weight_decay) == ("best", 0.0)


# -- The data, the grid and the initial gain ------------------------------------------------


def test_data_noise_is_separate_from_the_metric_noise():
  config = presets.get_config("regression", "authors2019", "vampire").replace(num_query=400)
  problem = regression.make_problem(config)
  keys = jax.random.split(jax.random.key(0), 50)
  tasks = problem.sample_tasks(problem.splits["train"], keys)
  truth = problem.query_truth(problem.splits["train"], keys)
  residual = np.asarray(tasks.query_y - truth)
  assert abs(residual.std() - 0.09) < 0.005  # the data's noise: 0.3^2, as the authors' code
  assert problem.noise_std == 0.3  # what the metric assumes
  # Test tasks query the 100-point grid; training tasks their own 15 random points.
  test = problem.sample_tasks(problem.splits["test"], keys[:3])
  np.testing.assert_allclose(test.query_x[0, :, 0], np.linspace(-5, 5, 100), atol=1e-6)
  np.testing.assert_array_equal(test.query_x[0], test.query_x[2])
  train = problem.sample_tasks(problem.splits["train"], keys[:3])
  assert train.query_x.shape == (3, 400, 1) and not np.allclose(train.query_x[0], train.query_x[1])
  # The default (data_noise_std None) is the metric's noise, with the same tasks as before.
  plain = regression.make_problem(presets.get_config("regression", "cpu", "vampire"))
  tasks = plain.sample_tasks(plain.splits["train"], keys)
  before = vj.data.sine_line.tasks_from_keys(
    jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 0), num_support=5, num_query=10
  )
  np.testing.assert_array_equal(tasks.query_y, before.query_y)


@pytest.mark.parametrize("gain", [1.0, math.sqrt(2.0)])
def test_kernel_init_gain_is_xavier_normal(gain):
  params = vj.init_params(vj.MLP((300, 300), 1, kernel_init_gain=gain), jax.random.key(0), (1, 200))
  kernel = np.asarray(params["Dense_1"]["kernel"])
  assert kernel.std() == pytest.approx(gain * math.sqrt(2.0 / 600), rel=0.02)


# -- What is tested, and recorded -------------------------------------------------------------


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
