"""`vj.fit_recalibration` and `vj.recalibrated_learner`: a run's maps for a learner of your own.

The library route against the run route (the same map, number for number, from a run's
learner and meta-parameters); the maps it fits against known miscalibrations (a Gaussian
likelihood whose noise is five times too small, a classifier that is twice too sharp),
and the recalibrated learner's predictive against what the map makes of the raw one, its
90 % intervals covering 90 % of new tasks' targets; its refusals, each naming the cause
and the fix; the README block's printed coverage against its comment.
"""

import doctest
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import REPO, untrained_regression_run
from vampire_jax import metrics

# -- Tasks of a known miscalibration ------------------------------------------------------------


def _line(params, x):  # a linear regressor, [n, 1] -> [n, 1]
  return x * params["w"] + params["b"]


LINE_PARAMS = {"w": jnp.zeros(()), "b": jnp.zeros(())}


def _line_tasks(seed, num_tasks, noise_std=1.0, num_support=20, num_query=10):
  """Tasks y = a x + b + noise_std eps, a ~ N(0, 1), b ~ N(0, 1), x ~ U(-2, 2)."""
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=(2, num_tasks, 1, 1))
  x = rng.uniform(-2.0, 2.0, (num_tasks, num_support + num_query, 1))
  y = a * x + b + noise_std * rng.normal(size=x.shape)
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  return vj.Task(x[:, :num_support], y[:, :num_support], x[:, num_support:], y[:, num_support:])


def _line_learner(noise_std=0.2):
  """MAML on a line whose likelihood's noise is `noise_std` (the data's is 1): overconfident.

  The inner rate over the Hessian of the support NLL (E[x^2] / sigma^2 for w, 1 / sigma^2
  for b) is 0.25 to 0.33: 8 steps fit the line to a few per mille.
  """
  return vj.maml(_line, vj.gaussian_nll(noise_std), num_inner_steps=8, inner_lr=0.01)


def _class_tasks(seed, num_tasks, temperature, ways=3, num_query=40):
  """Labels drawn from softmax(f / temperature), f = x @ W the network's logits.

  The support sets (one example of each class) are not used: the learner does not adapt.
  """
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_tasks, ways + num_query, 2)).astype(np.float32)
  logits = x @ np.asarray(CLASS_PARAMS["w"]) / temperature
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  labels = (rng.uniform(size=p.shape[:-1] + (1,)) > np.cumsum(p, -1)).sum(-1).astype(np.int32)
  support_y = np.tile(np.arange(ways, dtype=np.int32), (num_tasks, 1))
  return vj.Task(*map(jnp.asarray, (x[:, :ways], support_y, x[:, ways:], labels[:, ways:])))


CLASS_PARAMS = {"w": jnp.asarray([[3.0, -1.0, 0.0], [0.0, 2.0, -2.0]])}


def _linear_classifier(params, x):  # [n, 2] -> [n, 3] logits
  return x @ params["w"]


def _classifier():
  return vj.maml(_linear_classifier, vj.categorical_nll, num_inner_steps=0)


# -- The library route is the run route ----------------------------------------------------------


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  """An untrained VAMPIRE regression `vj.Run` and 10 validation tasks (100 targets)."""
  return untrained_regression_run(tmp_path_factory.mktemp("run"), 10)


def test_a_runs_learner_gets_the_map_of_recalibrate_number_for_number(regression_run):
  run, tasks = regression_run
  key = jax.random.key(3)
  runs = {}
  for method in ("variance_scale", None):
    runs[method] = vj.recalibrate(run, tasks, key, method=method)
    fitted = vj.fit_recalibration(run.learner, run.meta_params, tasks, key, method=method)
    assert fitted == runs[method].calibration  # every field, the quantile map's knots included
  assert fitted.method == "quantile"  # the default on 100 targets
  # The learner it makes predicts as the recalibrated run does: the same draws, noise and map.
  recalibrated = runs[None]
  learner = vj.recalibrated_learner(run.learner, fitted)
  assert learner.nll.noise_std == recalibrated.noise_std
  assert learner.nll.quantile_map == recalibrated.calibration.quantile_map
  task = jax.tree.map(lambda field: field[0], tasks)
  task_key = jax.random.key(4)
  task_params = run.learner.adapt(
    run.meta_params, task.support_x, task.support_y, jax.random.split(task_key)[0]
  )
  outputs = learner.predict(task_params, task.query_x, jax.random.split(task_key)[1])
  np.testing.assert_allclose(
    outputs,
    recalibrated.predict_function_draws(task.support_x, task.support_y, task.query_x, task_key),
    rtol=1e-4,  # eager here, jitted there
    atol=1e-5,
  )


# -- The maps, on known miscalibrations ---------------------------------------------------------


def test_intervals_five_times_too_narrow_cover_90_percent_of_new_tasks_once_recalibrated():
  """Data noise 1, likelihood noise 0.2: a line fitted to 20 points misses a new target by
  a variance of about 1 + 2 / 20, so the raw 90 % interval, +-1.645 * 0.2, holds
  P(|z| < 0.329 / sqrt(1.1)) = 25 % of them; the variance scale, near 25 * 1.1, gives it
  back its 90 %, and so does the default quantile map over it."""
  learner = _line_learner()
  val_tasks, new_tasks = _line_tasks(0, 100), _line_tasks(1, 100)
  key = jax.random.key(0)
  by_scale = vj.fit_recalibration(learner, LINE_PARAMS, val_tasks, key, method="variance_scale")
  assert by_scale.value == pytest.approx(25.0 * 1.1, rel=0.1)
  assert by_scale.nll_after < by_scale.nll_before - 5.0
  calibration = vj.fit_recalibration(learner, LINE_PARAMS, val_tasks, key, batch_tasks=30)
  assert calibration.method == "quantile" and calibration.value == by_scale.value

  def covered(learner, tasks):  # [tasks, query]: in the predictive's central 90 % interval
    def one_task(task, key):
      dist = vj.predictive(learner, LINE_PARAMS, task.support_x, task.support_y, task.query_x, key)
      lower, upper = vj.predictive_interval(dist, level=0.9)
      return (lower <= task.query_y) & (task.query_y <= upper)

    keys = jax.random.split(jax.random.key(1), len(tasks.query_y))  # the evaluators' split
    return np.asarray(jax.jit(jax.vmap(one_task))(tasks, keys))[..., 0]

  assert covered(learner, new_tasks).mean() == pytest.approx(0.25, abs=0.03)
  for fitted in (by_scale, calibration):
    recalibrated = vj.recalibrated_learner(learner, fitted)
    inside = covered(recalibrated, new_tasks)
    assert inside.mean() == pytest.approx(0.9, abs=0.025), fitted.method
  # The intervals are those of the quantile map: F_s^-1(R^-1(0.05)) to F_s^-1(R^-1(0.95)).
  noise = recalibrated.nll.noise_std
  outputs = vj.make_regression_evaluator(recalibrated, noise)(
    LINE_PARAMS, new_tasks, jax.random.key(1)
  ).predictions
  in_map = metrics.interval_coverage(
    outputs, new_tasks.query_y, noise, qmap=calibration.quantile_map
  )
  without_map = metrics.interval_coverage(outputs, new_tasks.query_y, noise)
  assert np.any(in_map != without_map)  # the map moves some targets in or out
  np.testing.assert_array_equal(inside, in_map)
  # The learner's evaluator, with the recalibrated noise, scores the recalibrated predictive.
  recalibrated = vj.recalibrated_learner(learner, by_scale)
  evaluate = vj.make_regression_evaluator(recalibrated, recalibrated.nll.noise_std)
  scored = evaluate(LINE_PARAMS, new_tasks, jax.random.key(2))
  raw_scored = vj.make_regression_evaluator(learner, 0.2)(LINE_PARAMS, new_tasks, jax.random.key(2))
  mapped = metrics.recalibrated_per_task(
    by_scale, dict(raw_scored._asdict(), targets=new_tasks.query_y), 0.2
  )
  np.testing.assert_allclose(scored.nll, mapped["nll"], rtol=1e-4)
  assert recalibrated.nll.noise_std == pytest.approx(0.2 * math.sqrt(by_scale.value))


def test_a_classifier_twice_too_sharp_gets_a_temperature_of_two():
  learner = _classifier()
  tasks = _class_tasks(0, 100, temperature=2.0)
  calibration = vj.fit_recalibration(learner, CLASS_PARAMS, tasks, jax.random.key(0))
  assert calibration.method == "temperature"
  assert calibration.value == pytest.approx(2.0, rel=0.1)
  # A predictive as sharp as its labels keeps a temperature of one.
  calibrated = _class_tasks(1, 100, temperature=1.0)
  assert vj.fit_recalibration(
    learner, CLASS_PARAMS, calibrated, jax.random.key(0)
  ).value == pytest.approx(1.0, rel=0.1)
  # The recalibrated learner's predictive is the tempered one, softmax(log p / T).
  recalibrated = vj.recalibrated_learner(learner, calibration)
  raw = vj.make_classification_evaluator(learner)(CLASS_PARAMS, tasks, jax.random.key(1))
  tempered = vj.make_classification_evaluator(recalibrated)(CLASS_PARAMS, tasks, jax.random.key(1))
  expected = jax.nn.softmax(jnp.log(raw.probabilities) / calibration.value, axis=-1)
  np.testing.assert_allclose(tempered.probabilities, expected, atol=1e-6)
  np.testing.assert_array_equal(tempered.accuracy, raw.accuracy)


def test_the_docstrings_examples_run():
  globs = {"jax": jax, "jnp": jnp, "vj": vj}
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
  for name in ("fit_recalibration", "recalibrated_learner"):
    tests = doctest.DocTestFinder(recurse=False).find(getattr(vj, name), name, globs=globs)
    assert [t for t in tests if t.examples], name
    for test in tests:
      runner.run(test)
  assert runner.failures == 0


# -- Refusals ------------------------------------------------------------------------------------


def test_fit_recalibration_refuses_what_recalibrate_refuses_naming_the_cause_and_the_fix():
  learner, tasks, key = _line_learner(), _line_tasks(0, 4), jax.random.key(0)

  def refused(match, *args, **kwargs):
    with pytest.raises(vj.InputError, match=match) as caught:
      vj.fit_recalibration(*args, **kwargs)
    assert "\n" not in str(caught.value) and "--" not in str(caught.value)

  fit = (learner, LINE_PARAMS)
  refused(
    r"^vj.fit_recalibration: learner must be a vj.MetaLearner", _line, LINE_PARAMS, tasks, key
  )
  own = learner._replace(nll=vj.distribution_nll(lambda out: None))
  refused(
    r"learner.nll must be vj.categorical_nll or a vj.gaussian_nll.*build the learner",
    own,
    LINE_PARAMS,
    tasks,
    key,
  )
  fitted = vj.fit_recalibration(*fit, tasks, key)
  again = vj.recalibrated_learner(learner, fitted)
  refused(
    r"learner is already recalibrated.*pass the learner it was made from",
    again,
    LINE_PARAMS,
    tasks,
    key,
  )
  vampire = vj.vampire(_line, vj.gaussian_nll(0.2))
  refused(
    r"meta_params is a .*pass the meta-parameters it trained", vampire, LINE_PARAMS, tasks, key
  )
  refused(r"key must be a PRNG key, jax.random.key\(seed\)", *fit, tasks, 0)
  refused(
    r"method must be 'quantile' or 'variance_scale' for a regression",
    *fit,
    tasks,
    key,
    method="temperature",
  )
  refused(r"batch_tasks must be an integer >= 1", *fit, tasks, key, batch_tasks=0)
  one = jax.tree.map(lambda field: field[:1], tasks)
  refused(r"tasks must be at least 2 tasks .*e.g. the validation tasks, got 1 task", *fit, one, key)
  refused(r"tasks must be a vampire_jax.Task", *fit, tuple(tasks), key)
  refused(
    r"tasks.query_x must be \[tasks, n, 1\] \(support_x's inputs\)",
    *fit,
    tasks._replace(query_x=tasks.query_x[..., None]),
    key,
  )
  refused(
    r"tasks.support_y must be \[tasks, n, outputs\] float targets",
    *fit,
    tasks._replace(support_y=tasks.support_y[..., 0]),
    key,
  )
  nan = tasks._replace(query_y=tasks.query_y.at[0, 0, 0].set(jnp.nan))
  refused(r"tasks.query_y must be finite, got 1 NaN", *fit, nan, key)
  wide = tasks._replace(support_x=jnp.tile(tasks.support_x, 3), query_x=jnp.tile(tasks.query_x, 3))
  refused(
    r"tasks do not fit the learner's network.*pass tasks of the inputs and targets it trained on",
    *fit,
    wide,
    key,
  )
  # Task 1's support set overflows the inner loop: its predictive is NaN, and named.
  overflow = tasks._replace(support_x=tasks.support_x.at[1].set(1e30))
  refused(
    r"1 of 4 tasks gave non-finite results \(tasks \[1\]\).*leave those tasks out",
    *fit,
    overflow,
    key,
  )
  refused(
    r"40 query targets are too few for a quantile map.*method='variance_scale'",
    *fit,
    tasks,
    key,
    method="quantile",
  )

  classifier, class_tasks = _classifier(), _class_tasks(0, 3, 1.0)
  fit = (classifier, CLASS_PARAMS)
  refused(
    r"method must be 'temperature' for a classification", *fit, class_tasks, key, method="quantile"
  )
  refused(
    r"tasks.query_y must be \[tasks, n\] integer labels",
    *fit,
    class_tasks._replace(query_y=class_tasks.query_y * 1.0),
    key,
  )
  out_of_range = class_tasks._replace(query_y=class_tasks.query_y.at[0, 0].set(3))
  refused(r"tasks.query_y must be class indices in \[0, 3\)", *fit, out_of_range, key)
  missing = class_tasks._replace(support_y=class_tasks.support_y.at[2, 0].set(1))
  refused(
    r"tasks.support_y \(task 2\) must be labels covering every class 0..2", *fit, missing, key
  )


def test_recalibrated_learner_refuses_a_map_of_another_kind_naming_the_fix():
  learner = _line_learner()
  temperature = metrics.Calibration("temperature", 2.0, 2, 1.0, 0.5)
  with pytest.raises(
    vj.InputError,
    match=r"calibration is a temperature, not a map of a regression .*fit one for this learner with vj.fit_recalibration",
  ):
    vj.recalibrated_learner(learner, temperature)
  with pytest.raises(
    vj.InputError, match=r"calibration must be a map fitted by vj.fit_recalibration"
  ):
    vj.recalibrated_learner(learner, {"method": "variance_scale", "value": 2.0})
  with pytest.raises(vj.InputError, match=r"learner must be a vj.MetaLearner"):
    vj.recalibrated_learner(_line, temperature)
  assert vj.recalibrated_learner(learner, None) is learner


# -- The README --------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_readmes_recalibration_block_prints_what_its_comment_says(capsys):
  """The "Use it from your own JAX code" blocks, run as a reader pastes them (about a minute):
  the raw and recalibrated 90 % coverage within 0.05 of the numbers the comment gives."""
  text = (REPO / "README.md").read_text()
  blocks = re.findall(r"<!-- readme-block: own-code -->\n```python\n(.*?)```", text, flags=re.S)
  code = "\n".join(blocks)
  said = re.search(r'print\(f"\{raw:\.2f\} \{mapped:\.2f\}"\)  # about ([\d.]+) ([\d.]+)', code)
  assert said, "the README prints no raw and recalibrated coverage with a comment"
  exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
  raw, mapped = (float(v) for v in capsys.readouterr().out.strip().splitlines()[-1].split())
  assert abs(raw - float(said[1])) <= 0.05 and abs(mapped - float(said[2])) <= 0.05, (raw, mapped)
  assert raw < 0.6 and abs(mapped - 0.9) < 0.05
