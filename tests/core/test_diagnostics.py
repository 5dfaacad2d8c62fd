"""The library refuses what it cannot do right: one row per case, as a table.

Every bad input raises an `InputError` (a ValueError) naming the function and
the argument; defaults stay finite for the likelihoods the library ships;
non-finite training is flagged; the inner-loop check knows the likelihood.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import (
  MLP_8,
  REGRESSION_MLP,
  _classification_problem,
  _simpa_task,
  _small_regression,
  _vampire_regression_learner,
)
from vampire_jax._src.core import diagnostics
from vampire_jax._src.core.errors import InputError
from vampire_jax.data import sine_line


def _tiny_mlp():
  model = vj.MLP((8,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  return params, vj.pure_apply(model), vj.gaussian_nll(0.5)


def _task(key, shots=5, query=7):
  x = jax.random.uniform(key, (shots + query, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x)
  return vj.Task(x[:shots], y[:shots], x[shots:], y[shots:])


NOISE_STD = 0.3


def _tiny(**settings):
  model = vj.MLP((6,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  options = dict(tasks_per_step=2, num_inner_steps=2, inner_lr=0.01, num_kl_samples=16)
  learner = vj.baselines.simpa(
    vj.pure_apply(model), vj.gaussian_nll(NOISE_STD), **{**options, **settings}
  )
  return learner, learner.init(params, jax.random.key(1)), params


def _regression_setup():
  apply_fn = vj.pure_apply(REGRESSION_MLP)
  params = vj.init_params(REGRESSION_MLP, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  return message


def _inner_loop_case(**settings):
  learner, params = _vampire_regression_learner(**settings)
  meta_params = learner.init(params, jax.random.key(1))
  task = jax.tree_util.tree_map(
    lambda field: field[0], sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 1))
  )
  return learner, meta_params, task


def test_the_kl_step_factor_is_against_the_standard_normal():
  # The KL to N(0, I) steps with factor inner_lr * kl_weight (sigma 1), not / sigma_p^2.
  params, apply_fn, nll = _tiny_mlp()
  learner = vj.vampire(
    apply_fn, nll, inner_lr=0.1, kl_weight=0.5, kl_target="standard_normal", num_inner_steps=1
  )
  prior = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, prior, _task(jax.random.key(2)), jax.random.key(3))
  assert report.kl_factor == pytest.approx(0.05)
  vampire = vj.vampire(apply_fn, nll, inner_lr=0.1, kl_weight=0.5, num_inner_steps=1)
  report = vj.check_inner_loop(vampire, prior, _task(jax.random.key(2)), jax.random.key(3))
  assert report.kl_factor > 100  # against the prior's sigma_p ~ e^-3.5


def test_check_inner_loop_takes_simpas_meta_parameters_and_names_them_when_not_given():
  """The training loop runs `vj.check_inner_loop` first: it takes SImPa's meta-parameters
  (SImPa's init does not take its own output back), and refuses a weight tree naming
  SimpaParams."""
  learner, meta_params, params = _tiny()
  task = _simpa_task()
  report = vj.check_inner_loop(learner, meta_params, task, jax.random.key(0))
  assert np.isfinite(report.loss_after)
  with pytest.raises(vj.InputError, match=r"is a weight tree, but .* makes a SimpaParams") as e:
    vj.check_inner_loop(learner, params, task, jax.random.key(0))
  assert len(str(e.value).splitlines()) == 1


def test_check_inner_loop_finds_a_diverging_step_and_its_advice_works():
  apply_fn, params, task = _regression_setup()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.1), inner_lr=0.01)
  prior = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, prior, task, jax.random.key(2))
  assert not report.ok and not np.isfinite(report.loss_after)
  # The curvature is the Hessian's top eigenvalue: compare with a dense Hessian of the last layer.
  assert 1e3 < report.curvature < 1e5
  assert "use inner_lr" in report.advice and "(now 0.01)" in report.advice
  advised = float(report.advice.split("use inner_lr ")[1].split()[0])
  assert advised < report.stable_inner_lr
  fixed = vj.vampire(apply_fn, vj.gaussian_nll(0.1), inner_lr=advised)
  assert vj.check_inner_loop(fixed, prior, task, jax.random.key(2)).ok


def test_largest_curvature_is_the_top_hessian_eigenvalue():
  """Against a dense Hessian of a small quadratic-plus-softplus loss."""

  def loss_fn(w, x, y):
    return jnp.mean(jnp.square(x @ w["a"] - y)) + jnp.sum(jax.nn.softplus(w["b"]) ** 2)

  x = jax.random.normal(jax.random.key(0), (20, 4))
  y = jax.random.normal(jax.random.key(1), (20,))
  w = {"a": jnp.arange(4.0) / 4, "b": jnp.array([0.3, -0.2])}
  flat, unravel = jax.flatten_util.ravel_pytree(w)
  dense = jax.hessian(lambda f: loss_fn(unravel(f), x, y))(flat)
  top = float(np.max(np.linalg.eigvalsh(np.asarray(dense))))
  got = float(
    diagnostics.largest_curvature(loss_fn, w, x, y, jax.random.key(2), num_iterations=100)
  )
  np.testing.assert_allclose(got, top, rtol=1e-3)


def test_check_inner_loop_names_the_kl_factor():
  apply_fn, params, task = _regression_setup()
  learner = vj.vampire(apply_fn, vj.gaussian_nll(1.0), inner_lr=1e-3, kl_weight=50.0)
  report = vj.check_inner_loop(
    learner, learner.init(params, jax.random.key(1)), task, jax.random.key(2)
  )
  assert report.kl_factor > 2 and "KL term's step factor" in report.advice


def test_debug_nonfinite_names_the_operation():
  apply_fn, params, task = _regression_setup()
  learner = vj.maml(apply_fn, vj.gaussian_nll(0.1), inner_lr=10.0)
  adapt = vj.debug_nonfinite(lambda p: learner.adapt(p, task.support_x, task.support_y, None))
  with pytest.raises(FloatingPointError, match="nan generated by primitive"):
    adapt(params)
  fine = vj.debug_nonfinite(
    lambda p: vj.maml(apply_fn, vj.gaussian_nll(0.1)).adapt(p, task.support_x, task.support_y, None)
  )
  chex.assert_tree_all_finite(fine(params))


@pytest.mark.parametrize(
  "case", ["point_mass", "log_std_-100", "inner_lr_1e308", "kl_weight_1e308"]
)
def test_check_inner_loop_diagnoses_what_it_exists_for_without_crashing(case):
  """A point mass, log-stds of -100, inner_lr or kl_weight 1e308: check_inner_loop reports
  not ok in one line of advice, naming the KL step factor or the narrow prior where they are
  the cause, and never advising a larger inner_lr."""
  apply_fn, params, task = _small_regression()
  inner_lr, kl_weight = 1e-3, 0.1
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  if case == "point_mass":
    prior = vj.point_mass(params)
  elif case == "log_std_-100":
    prior = vj.Gaussian(params, jax.tree_util.tree_map(lambda p: jnp.full_like(p, -100.0), params))
  elif case == "inner_lr_1e308":
    inner_lr = 1e308
  else:
    kl_weight = 1e308
  learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), inner_lr=inner_lr, kl_weight=kl_weight)
  report = vj.check_inner_loop(learner, prior, task, jax.random.key(4))
  assert not report.ok
  assert len(report.advice.splitlines()) == 1
  if case != "inner_lr_1e308":
    assert "KL term's step factor" in report.advice
  if case in ("point_mass", "log_std_-100"):
    assert "too narrow for KL steps" in report.advice
  if "use inner_lr" in report.advice:  # never advice to raise the step that failed
    advised = float(report.advice.split("use inner_lr ")[1].split(" ")[0])
    assert advised < inner_lr


def test_check_inner_loop_measures_curvature_under_x64():
  """Under x64 check_inner_loop measures a positive curvature (the power iteration's carry
  keeps its dtype)."""
  import subprocess
  import sys

  code = (
    "import jax, jax.numpy as jnp, vampire_jax as vj\n"
    "from vampire_jax.data import sine_line\n"
    "net = vj.MLP((16,), 1); apply_fn = vj.pure_apply(net)\n"
    "params = vj.init_params(net, jax.random.key(0), (1, 1))\n"
    "task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))\n"
    "learner = vj.vampire(apply_fn, vj.gaussian_nll(0.3), inner_lr=10.0, kl_weight=0.01)\n"
    "r = vj.check_inner_loop(learner, vj.gaussian_from_params(params, jax.random.key(1)), task,"
    " jax.random.key(4))\n"
    "assert r.curvature is not None and r.curvature > 0, r\n"
    "print('curvature', r.curvature)\n"
  )
  env = {**__import__("os").environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]


def test_kl_step_factor_of_an_empty_tree_is_one_line():
  """kl_step_factor of an empty tree is refused saying the prior has no weights."""
  with pytest.raises(InputError, match="kl_step_factor: the prior has no weights"):
    vj.kl_step_factor(vj.Gaussian({}, {}), 0.01, 0.1)


@pytest.mark.parametrize(
  "field, value, name",
  [("support_y", jnp.nan, "task.support_y"), ("support_x", jnp.inf, "task.support_x")],
)
def test_check_inner_loop_names_non_finite_task_values_not_the_step_size(field, value, name):
  """NaN targets and infinite inputs are named as the task's field that must be finite,
  with the count of bad values, not blamed on inner_lr."""
  learner, meta_params, task = _inner_loop_case()
  bad = task._replace(**{field: getattr(task, field).at[0].set(value)})
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, bad, jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith(f"check_inner_loop: {name} ")  # the function and the field
  assert "must be finite" in message and "got 1 NaN or infinite values of 5" in message


def test_check_inner_loop_names_non_finite_meta_parameters():
  """NaN meta-parameters are refused naming the leaf of meta_params, not the KL factor."""
  learner, meta_params, task = _inner_loop_case()
  bad = jax.tree_util.tree_map(lambda leaf: leaf * jnp.nan, meta_params)
  with pytest.raises(InputError, match=r"check_inner_loop: meta_params\.mean\[.* free of NaN"):
    vj.check_inner_loop(learner, bad, task, jax.random.key(3))


@pytest.mark.parametrize("algorithm", ["vampire", "maml"])
def test_check_inner_loop_of_zero_inner_steps_says_so(algorithm):
  """A learner of num_inner_steps 0 is reported as taking no inner steps, without advice on
  inner_lr, and its loss is the support NLL at the meta-parameters."""
  params = vj.init_params(MLP_8, jax.random.key(0), (1, 1))
  make = vj.vampire if algorithm == "vampire" else vj.maml
  learner = make(vj.pure_apply(MLP_8), vj.gaussian_nll(0.3), num_inner_steps=0)
  _, _, task = _inner_loop_case()
  meta_params = learner.init(params, jax.random.key(1))
  report = vj.check_inner_loop(learner, meta_params, task, jax.random.key(3))
  assert not report.ok and report.loss_after == report.loss_before
  assert report.advice.startswith("the learner takes no inner steps (num_inner_steps 0)")
  assert "inner_lr" not in report.advice
  # The loss it reports is the support NLL at the meta-parameters, as with inner steps.
  stepping = make(vj.pure_apply(MLP_8), vj.gaussian_nll(0.3), num_inner_steps=1)
  with_steps = vj.check_inner_loop(stepping, meta_params, task, jax.random.key(3))
  assert report.loss_before == pytest.approx(with_steps.loss_before, rel=1e-6)


def test_check_inner_loop_refuses_a_gaussian_for_maml_and_weights_for_vampire():
  """MAML given a vj.Gaussian, and VAMPIRE given a weight tree, are refused in one line
  naming what meta_params is and what the learner's init makes."""
  vampire, gaussian, task = _inner_loop_case()
  maml = vj.maml(vj.pure_apply(MLP_8), vj.gaussian_nll(0.3), num_inner_steps=1)
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(maml, gaussian, task, jax.random.key(3))
  assert _one_line(raised).startswith(
    "check_inner_loop: meta_params is a vj.Gaussian, but this learner's init makes a weight tree"
  )
  with pytest.raises(InputError, match="meta_params is a weight tree, but .* makes a vj.Gaussian"):
    vj.check_inner_loop(vampire, gaussian.mean, task, jax.random.key(3))
  assert vj.check_inner_loop(maml, gaussian.mean, task, jax.random.key(3)).ok


def test_check_inner_loop_refuses_a_task_given_as_a_tuple_or_a_batch():
  """A task given as a tuple is refused naming vj.Task(*task); a batch of one task names
  task.support_x's shape under check_inner_loop, not `adapt`; an int key is refused."""
  learner, meta_params, task = _inner_loop_case()
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, meta_params, tuple(task), jax.random.key(3))
  message = _one_line(raised)
  assert message.startswith("check_inner_loop: task ")  # the function and the argument
  assert "must be one vj.Task(support_x, support_y, query_x, query_y)" in message
  assert "got tuple" in message and "wrap it: vj.Task(*task)" in message  # the value, the fix
  batch = jax.tree_util.tree_map(lambda field: field[None], task)
  with pytest.raises(InputError, match=r"check_inner_loop: task.support_x float32\[1, 5, 1\]"):
    vj.check_inner_loop(learner, meta_params, batch, jax.random.key(3))
  with pytest.raises(InputError, match="check_inner_loop: key must be a PRNG key"):
    vj.check_inner_loop(learner, meta_params, task, 3)
  assert vj.check_inner_loop(learner, meta_params, vj.Task(*tuple(task)), jax.random.key(3)).ok


def test_check_inner_loop_refuses_labels_outside_the_networks_classes():
  """5-way labels for a classifier of 3 outputs are refused naming the labels' range."""
  problem = _classification_problem(num_outputs=3)
  task = jax.tree_util.tree_map(
    lambda field: field[0],
    problem.sample_tasks(problem.splits["train"], jax.random.split(jax.random.key(0), 1)),
  )
  params = vj.init_params(problem.model, jax.random.key(0), (1, 8, 8, 1))
  learner = vj.maml(vj.pure_apply(problem.model), vj.categorical_nll, num_inner_steps=1)
  with pytest.raises(InputError) as raised:
    vj.check_inner_loop(learner, params, task, jax.random.key(3))
  assert _one_line(raised).startswith(
    "check_inner_loop: task.support_y cannot be scored: categorical_nll: labels must be class "
    "indices in [0, 3) for 3 outputs"
  )
