"""One `train_and_evaluate` (issue 43): an experiment is the library's loop given the function
that builds its problem, and each check of the config and the folder runs once, before the
data is loaded."""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import regression
from tests.conftest import tiny_regression_config
from tests.helpers import _tiny_regression_config
from vampire_jax._src.core.errors import ConfigError, InputError
from vampire_jax.runs import loop

WAYS, SHOTS, QUERY = 3, 2, 3


def _blob_tasks(split_id, task_keys):
  """3-way tasks of 2-d Gaussian blobs, each task's classes its own means."""

  def one(key):
    means_key, support_key, query_key = jax.random.split(jax.random.fold_in(key, split_id), 3)
    means = 2.0 * jax.random.normal(means_key, (WAYS, 1, 2))
    support = means + 0.3 * jax.random.normal(support_key, (WAYS, SHOTS, 2))
    query = means + 0.3 * jax.random.normal(query_key, (WAYS, QUERY, 2))
    return vj.Task(
      support.reshape(-1, 2),
      jnp.repeat(jnp.arange(WAYS), SHOTS),
      query.reshape(-1, 2),
      jnp.repeat(jnp.arange(WAYS), QUERY),
    )

  return jax.vmap(one)(task_keys)


def _problem(embedding: bool) -> vj.Problem:
  splits = {"train": jnp.uint32(0), "val": jnp.uint32(1), "test": jnp.uint32(2)}
  model = vj.MLP((8,), None if embedding else WAYS)
  return vj.Problem(model=model, input_shape=(2,), splits=splits, sample_tasks=_blob_tasks)


SPECS = {
  "vampire": vj.specs.Vampire(inner_lr=0.05),
  "vampire2": vj.specs.Vampire2(inner_lr=0.05),
  "maml": vj.specs.Maml(inner_lr=0.05),
  "fomaml": vj.specs.Fomaml(inner_lr=0.05),
  "platipus": vj.specs.Platipus(inner_lr=0.05, kl_weight=0.01),
  "bmaml": vj.specs.Bmaml(num_particles=2, inner_lr=0.05),
  "abml": vj.specs.Abml(inner_lr=0.05),
  "protonet": vj.specs.Protonet(num_classes=WAYS),
  "simpa": vj.specs.Simpa(inner_lr=0.05, num_kl_samples=4),
}


def _config(spec) -> vj.RunConfig:
  return vj.RunConfig(
    algorithm=spec,
    schedule=vj.Schedule(tasks_per_step=2, num_meta_steps=2),
    evaluation=vj.Evaluation(
      num_val_tasks=2,
      num_test_tasks=2,
      eval_batch_tasks=2,
      eval_every=2,
      checkpoint_every=2,
      log_every=1,
    ),
  )


OWN_SPEC = textwrap.dedent(
  """
  import dataclasses, sys
  import jax, jax.numpy as jnp
  import vampire_jax as vj
  sys.path.insert(0, {root!r})
  from tests.runs.test_loop import _problem

  @dataclasses.dataclass(frozen=True)
  class ShrunkMaml(vj.AlgorithmSpec):
    name = "shrunk_maml"
    inner_lr: float = vj.specs.option(0.05, "the inner rate")
    shrink: float = vj.specs.option(0.5, "the share of the adaptation kept")

    def learner(self, apply_fn, nll, context=vj.specs.Context(), *, num_mc=None):
      maml = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=self.inner_lr)

      def adapt(params, support_x, support_y, key):
        adapted = maml.adapt(params, support_x, support_y, key)
        return jax.tree.map(lambda p, a: p + self.shrink * (a - p), params, adapted)

      return maml._replace(adapt=adapt)
  """
)


QUIET = dict(progress=False, print_fn=lambda message: None)


def _count_calls(monkeypatch, module, name, calls):
  real = getattr(module, name)

  def counted(*args, **kwargs):
    calls[name] = calls.get(name, 0) + 1
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("name", list(SPECS))
def test_every_algorithm_trains_from_its_spec_and_loads_back(name, tmp_path):
  spec = SPECS[name]
  assert spec.name == name
  config = _config(spec)
  results = vj.train_and_evaluate(
    _problem(spec.embedding), config, tmp_path, progress=False, print_fn=lambda line: None
  )
  recorded = json.loads((tmp_path / "results.json").read_text())["config"]["algorithm"]
  assert recorded == {
    "name": name,
    "spec": f"vampire_jax.runs.specs.{type(spec).__name__}",
    **json.loads(json.dumps(spec.settings())),
  }
  assert json.loads(json.dumps(results["config"]["algorithm"])) == recorded
  assert results["tested_step"] == 2 and np.isfinite(results["test"]["nll"])
  run = vj.load_run(tmp_path)
  assert run.config == config
  # Resumed with a longer schedule: the same spec, nothing of another algorithm to clear.
  resumed = vj.train_and_evaluate(
    _problem(spec.embedding),
    config.replace(num_meta_steps=4, eval_every=4, checkpoint_every=4),
    tmp_path,
    progress=False,
    print_fn=lambda line: None,
  )
  assert (resumed["resumed_from_step"], resumed["meta_steps"]) == (2, 4)
  # The best validation's meta-parameters (step 2 or 4) are the ones tested and loaded.
  assert vj.load_run(tmp_path).step == resumed["tested_step"] in (2, 4)


def test_a_spec_written_outside_the_package_trains_saves_and_reloads(tmp_path):
  """In fresh processes, as a user runs it: a script defines its spec and trains; another
  script loads the folder, passing its own copy of the class."""
  root = str(__import__("pathlib").Path(__file__).parents[2])
  train = OWN_SPEC.format(root=root) + textwrap.dedent(
    f"""
    config = vj.RunConfig(algorithm=ShrunkMaml(shrink=0.8),
        schedule=vj.Schedule(tasks_per_step=2, num_meta_steps=2),
        evaluation=vj.Evaluation(num_val_tasks=2, num_test_tasks=2, eval_batch_tasks=2,
                                 eval_every=2, checkpoint_every=2, log_every=1))
    results = vj.train_and_evaluate(_problem(False), config, {str(tmp_path)!r}, progress=False)
    print("trained", results["config"]["algorithm"]["name"], results["tested_step"])
    """
  )
  # Before the script defines its class, `__main__.ShrunkMaml` does not import: the refusal
  # says how to pass the class.
  refused = textwrap.dedent(
    f"""
    import vampire_jax as vj
    try:
      vj.load_run({str(tmp_path)!r})
    except vj.RunFolderError as error:
      print("refused:", error)
    """
  )
  loaded = textwrap.dedent(
    f"""
    run = vj.load_run({str(tmp_path)!r}, algorithm=ShrunkMaml)
    print("loaded", run.config.algorithm, run.step)
    """
  )
  load = refused + OWN_SPEC.format(root=root) + loaded
  outs = []
  for script in (train, load):
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    outs.append(done.stdout)
  assert "trained shrunk_maml 2" in outs[0]
  out = outs[1]
  assert "refused:" in out and "algorithm=ShrunkMaml" in out  # how to pass a __main__ class
  assert "loaded ShrunkMaml(inner_lr=0.05, shrink=0.8) 2" in out


def test_a_run_checks_its_config_once_and_its_folder_before_the_data(tmp_path, monkeypatch):
  calls = {}
  _count_calls(monkeypatch, loop.algorithms, "check_config", calls)
  _count_calls(monkeypatch, loop.run_folder, "check_resumable", calls)
  _count_calls(monkeypatch, loop.run_folder, "check_not_in_use", calls)
  _count_calls(monkeypatch, regression, "make_problem", calls)
  config = tiny_regression_config(num_meta_steps=2)
  results = regression.run_experiment(config, tmp_path / "run", **QUIET)
  assert results["meta_steps"] == 2
  # check_resumable: once before the data, once under the folder's lock (prepare_workdir).
  assert calls == {
    "check_config": 1,
    "check_not_in_use": 1,
    "check_resumable": 2,
    "make_problem": 1,
  }


def test_a_refused_run_loads_no_data(tmp_path, monkeypatch):
  config = tiny_regression_config(num_meta_steps=2)
  regression.run_experiment(config, tmp_path, **QUIET)
  calls = {}
  _count_calls(monkeypatch, regression, "make_problem", calls)
  other = config.replace(hidden_sizes=(4, 4))
  with pytest.raises(ConfigError, match="holds a run with another config"):
    regression.run_experiment(other, tmp_path, **QUIET)
  impossible = config.replace(tasks_per_step=0)
  with pytest.raises(ConfigError):
    regression.run_experiment(impossible, tmp_path / "new", **QUIET)
  assert calls == {}
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
  "problem, message",
  [
    ({"model": None}, "problem is a dict; pass a vj.Problem or a function that returns one"),
    (lambda: {"model": None}, "the problem's function returned a dict, not a vj.Problem"),
  ],
)
def test_a_problem_that_is_not_one_is_refused_in_one_line(tmp_path, problem, message):
  config = tiny_regression_config(num_meta_steps=2)
  with pytest.raises(InputError, match=message):
    vj.train_and_evaluate(problem, config, tmp_path / "run", **QUIET)
  assert not (tmp_path / "run").exists()  # refused before the folder is made


def test_training_with_debug_nans_names_the_first_nan(tmp_path):
  # Stable at initialisation (the check passes), NaN within the first meta-step's outer update.
  config = _tiny_regression_config(
    inner_lr=1e-3,
    meta_lr=1e30,
    num_meta_steps=4,
    log_every=1,
    eval_every=4,
    checkpoint_every=4,
    debug_nans=True,
  )
  with pytest.raises(FloatingPointError, match="generated by primitive"):
    regression.run_experiment(config, tmp_path, progress=False, print_fn=lambda m: None)


def test_training_refuses_a_split_with_nan_before_making_the_folder(tmp_path):
  config = _tiny_regression_config()
  problem = regression.make_problem(config)
  splits = dict(problem.splits, train={"images": np.array([[0.0, np.nan]], np.float32)})
  with pytest.raises(InputError, match=r"problem.splits\['train'\]\['images'\] must be finite"):
    vj.train_and_evaluate(
      problem._replace(splits=splits),
      config,
      tmp_path / "run",
      progress=False,
      print_fn=lambda m: None,
    )
  assert not (tmp_path / "run").exists()
