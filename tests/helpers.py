"""Helpers that tests in several files share: small networks, tasks, learners and
checks. (Fixtures shared the same way are in conftest.py.)"""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import (
  tiny_regression_config,
)
from vampire_jax.data import (
  sine_line,
)
from vampire_jax.runs import (
  run_folder,
)

simpa_module = importlib.import_module("vampire_jax.baselines.simpa")


REPO_ROOT = Path(__file__).resolve().parents[1]


MLP_16 = vj.MLP((16,), 1)


REGRESSION_MLP = vj.MLP((100, 100, 100), 1)  # the paper's regression network


MLP_8 = vj.MLP((8,), 1)


NOISE = 0.3


NLL = vj.gaussian_nll(0.3)


SAMPLE_DIR = Path(
  os.environ.get("MINI_IMAGENET_DIR")
  or Path(__file__).resolve().parents[2] / "shared/data/mini_imagenet_sample"
)


PER_CLASS = 12  # images per class in the sample


needs_mini_imagenet_sample = pytest.mark.skipif(
  not (SAMPLE_DIR / "split" / "test.csv").exists(),
  reason=f"mini-ImageNet sample not found in {SAMPLE_DIR}",
)


DATA_DIR = Path(
  os.environ.get("OMNIGLOT_DIR") or Path(__file__).resolve().parents[2] / "shared/data/omniglot"
)


BIG_ZIPS = ("images_background.zip", "images_evaluation.zip")


SMALL_ZIPS = ("images_background_small1.zip", "images_background_small2.zip")


needs_data = pytest.mark.skipif(
  not all((DATA_DIR / f).is_file() for f in BIG_ZIPS),
  reason=f"Omniglot zips not found in {DATA_DIR} (set OMNIGLOT_DIR).",
)


needs_small_zips = pytest.mark.skipif(
  not all((DATA_DIR / f).is_file() for f in SMALL_ZIPS),
  reason=f"Omniglot small zips not found in {DATA_DIR}.",
)


ROOT = Path(__file__).resolve().parents[1]


LEVELS = np.linspace(0.1, 0.9, 9)


SUPPORT_X = np.linspace(-4.0, 4.0, 5, dtype=np.float32)[:, None]


QUERY_X = np.linspace(-5.0, 5.0, 7, dtype=np.float32)[:, None]


def python_json(code: str, timeout: int = 120):
  """What `code`, run by this Python in a fresh interpreter at the repository's root, prints
  as JSON on its last line (the run must succeed)."""
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
  )
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _argparse_error(capsys, parse) -> str:
  with pytest.raises(SystemExit) as raised:
    parse()
  assert raised.value.code == 2
  return capsys.readouterr().err.splitlines()[-1]


def _check_gradient_by_finite_differences(f, args, seed=0, num_directions=3, eps=1e-5, rtol=1e-5):
  """<∇f(x), v> against (f(x + eps v) − f(x − eps v)) / 2 eps along random directions v (float64).

  One compiled `value_and_grad` gives the gradient and the shifted values;
  the directions are drawn with NumPy to keep eager JAX work out of it.
  """
  value_and_grad = jax.jit(jax.value_and_grad(f))
  _, grads = value_and_grad(args)
  leaves, treedef = jax.tree_util.tree_flatten(jax.tree_util.tree_map(np.asarray, args))
  rng = np.random.default_rng(seed)
  for _ in range(num_directions):
    direction = [rng.standard_normal(x.shape) for x in leaves]
    shifted = [
      jax.tree_util.tree_unflatten(treedef, [x + sign * eps * v for x, v in zip(leaves, direction)])
      for sign in (1.0, -1.0)
    ]
    numerical = (float(value_and_grad(shifted[0])[0]) - float(value_and_grad(shifted[1])[0])) / (
      2 * eps
    )
    analytic = sum(
      float(np.vdot(g, v)) for g, v in zip(jax.tree_util.tree_leaves(grads), direction)
    )
    np.testing.assert_allclose(analytic, numerical, rtol=rtol)
    assert abs(analytic) > 1e-3


def _checkpoint_params(workdir: Path, step: int):
  return run_folder.read_checkpoint(workdir / "checkpoints", step)["meta_params"]


def _classification_problem(num_outputs: int, ways: int = 5):
  """Random 8x8 'images' of 10 classes; a Conv4 of `num_outputs` outputs."""
  from vampire_jax.data import tasks_from_keys

  images = jax.random.randint(jax.random.key(0), (10, 4, 8, 8, 1), 0, 255).astype(jnp.uint8)

  def sample_tasks(class_images, task_keys):
    return tasks_from_keys(task_keys, class_images, ways=ways, shots=1, query=1)

  return vj.Problem(
    model=vj.Conv4(num_classes=num_outputs, num_filters=4),
    input_shape=(8, 8, 1),
    splits={"train": images, "val": images, "test": images},
    sample_tasks=sample_tasks,
    kind="classification",
  )


def _classification_task(classes=None):
  x = jax.random.uniform(jax.random.key(2), (12, 1), minval=-3.0, maxval=3.0)
  y = jnp.sin(x) if classes is None else jnp.arange(12) % classes  # labels: a classifier's
  return vj.Task(x[:5], y[:5], x[5:], y[5:])


def _classifier_predictive(classifier):
  learner, meta_params, tasks, keys, per_task = classifier
  task = _first(tasks)
  dist = vj.predictive(learner, meta_params, task.support_x, task.support_y, task.query_x, keys[0])
  return dist, task, per_task


def _conv4(padding, conv_impl="xla", max_pool=False):
  return vj.Conv4(
    num_classes=3, num_filters=4, max_pool=max_pool, conv_impl=conv_impl, padding=padding
  )


def _first(tasks):
  return jax.tree.map(lambda field: field[0], tasks)


def _flat(tree) -> np.ndarray:
  return np.concatenate([np.ravel(leaf) for leaf in jax.tree_util.tree_leaves(tree)])


def _images(size=28, channels=1):
  return jax.random.uniform(jax.random.key(0), (2, size, size, channels))


def _leaves_equal(a, b) -> bool:
  return all(
    np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def _loss(learner, prior, classes=None):
  return vj.query_loss(learner, prior, _classification_task(classes), jax.random.key(3))[0]


def _max_abs_difference(a, b):
  return max(
    float(jnp.max(jnp.abs(x - y)))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  )


def _one_line_error(output: str, *needles: str) -> None:
  errors = [line for line in output.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in output, output
  for needle in needles:
    assert needle in errors[0], (needle, errors[0])


def _regression_problem(hidden=(16,)):
  from experiments import regression

  config = regression.get_config("quick").replace(hidden_sizes=hidden)
  return regression.make_problem(config)


def _regression_problem_and_config():
  from experiments import regression
  from tests.conftest import tiny_regression_config

  config = tiny_regression_config(num_meta_steps=2)
  return regression.make_problem(config), config


def _sample(data, task_keys):
  del data
  return sine_line.tasks_from_keys(task_keys)


def _sampler(data, task_keys):
  del data  # generated tasks
  return sine_line.tasks_from_keys(task_keys, num_support=5, num_query=5)


def _setup(algorithm, num_tasks=4):
  model = vj.MLP((16,), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  apply_fn, nll = vj.pure_apply(model), vj.gaussian_nll(0.3)
  if algorithm == "maml":
    learner = vj.maml(apply_fn, nll, num_inner_steps=2, inner_lr=0.005)
  else:
    learner = vj.vampire(
      apply_fn,
      nll,
      num_inner_steps=2,
      inner_lr=0.005,
      kl_weight=0.1,
      num_mc_train=2,
      num_mc_query=2,
    )
  optimizer = vj.meta_optimizer(1e-3, tasks_per_step=num_tasks)
  return learner, optimizer, vj.init_meta_state(learner, optimizer, params, jax.random.key(1))


def _simpa_task(index=0):
  tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(7), 2))
  return jax.tree_util.tree_map(lambda field: field[index], tasks)


def _small_regression():
  from vampire_jax.data import sine_line

  apply_fn = vj.pure_apply(MLP_16)
  params = vj.init_params(MLP_16, jax.random.key(0), (1, 1))
  task = jax.tree_util.tree_map(lambda v: v[0], sine_line.sample_tasks(jax.random.key(5), 1))
  return apply_fn, params, task


def _synthetic_classifier(rng, n, num_classes, confidence, accuracy_given_confidence):
  """Probabilities whose max is `confidence`, correct with the given probability."""
  probs = np.tile(((1 - confidence) / (num_classes - 1))[:, None], (1, num_classes))
  predicted = rng.integers(num_classes, size=n)
  probs[np.arange(n), predicted] = confidence
  correct = rng.random(n) < accuracy_given_confidence
  # A wrong label is any other class.
  wrong = (predicted + rng.integers(1, num_classes, size=n)) % num_classes
  return probs, np.where(correct, predicted, wrong)


def _tiny_config(**changes):
  return tiny_regression_config(**{"num_meta_steps": 4, "num_mc_test": 2, **changes})


def _tiny_hidden_mlp(dtype=jnp.float32, hidden=(8,)):
  model = vj.MLP(hidden, 1)
  params = jax.tree_util.tree_map(
    lambda p: p.astype(dtype), vj.init_params(model, jax.random.key(0), (1, 1))
  )
  apply_fn = vj.pure_apply(model)
  nll = vj.gaussian_nll(0.5)
  return params, apply_fn, nll, vj.loss_from_apply(apply_fn, nll)


def _tiny_regression_config(**changes):
  return tiny_regression_config("maml", **{"num_meta_steps": 2, **changes})


def _truncate_data(folder: Path) -> None:
  """Cuts every array data file of an orbax checkpoint to 10 bytes (the metadata stays)."""
  files = list(folder.glob("**/ocdbt.process_0/d/*"))
  assert files, folder
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(10)


def _two_component_problem(rng, n, true_std, noise_std=0.3):
  """Predicted means [2, n] and targets drawn from the mixture with `true_std`."""
  centre = rng.uniform(-3, 3, size=n)
  means = np.stack([centre - 0.5, centre + rng.uniform(0, 1.5, size=n)])
  component = rng.integers(2, size=n)
  targets = means[component, np.arange(n)] + true_std * rng.normal(size=n)
  return means, targets


def _vampire_regression_learner(**settings):
  params = vj.init_params(MLP_8, jax.random.key(0), (1, 1))
  learner = vj.vampire(
    vj.pure_apply(MLP_8), vj.gaussian_nll(0.3), **{"num_inner_steps": 1, **settings}
  )
  return learner, params


def _resident_kb(start: int) -> int:
  """Rss (KiB) of this process's mapping that begins at address `start`, from smaps."""
  lines = Path("/proc/self/smaps").read_text().splitlines()
  for i, line in enumerate(lines):
    if line.split("-", 1)[0] == f"{start:x}":
      for detail in lines[i + 1 :]:
        if detail.startswith("Rss:"):
          return int(detail.split()[1])
  raise AssertionError(f"no mapping at {start:x}")


def check_page_out_drops_a_files_pages(tmp_path: Path, page_out) -> None:
  """Maps a 32 MiB file of the caller's own read-only, reads every page, calls `page_out()`
  (a page-out of the process's read-only file pages, returning the mappings the kernel
  took): its pages leave the resident memory, and reading it again gives the same bytes.
  Skips where the kernel has no MADV_PAGEOUT (Linux before 5.4)."""
  import mmap

  path = tmp_path / "pages.bin"
  content = bytes(range(256)) * (32 * 4096)  # 32 MiB
  with open(path, "wb") as out:
    out.write(content)
    out.flush()
    os.fsync(out.fileno())  # clean pages: the kernel can drop them at once
  with open(path, "rb") as source:
    view = mmap.mmap(source.fileno(), 0, prot=mmap.PROT_READ)
  try:
    start = next(
      int(line.split("-", 1)[0], 16)
      for line in Path("/proc/self/maps").read_text().splitlines()
      if line.rstrip().endswith(str(path))
    )
    pages = range(7, len(content), 4096)
    assert sum(view[i] for i in pages) == 7 * len(pages)  # every page read
    before = _resident_kb(start)
    taken = page_out()
    after = _resident_kb(start)
    if taken == 0:
      pytest.skip("this kernel has no MADV_PAGEOUT (Linux 5.4 or later)")
    assert before > 30 * 1024 and after < 4 * 1024, (before, after)
    assert view[:] == content  # nothing lost
  finally:
    view.close()
