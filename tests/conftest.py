"""Shared test set-up: the XLA compilation cache, the Omniglot data, one tiny trained run."""

import functools
import gc
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

# Quieter TensorFlow if a data test imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One CPU device in the test processes and the commands they start, for speed: the many
# small in-process checks run faster on one device than sharded over two. A user's command
# gets one device per core (`vj.use_all_cpu_cores`), so what this hides is covered by
# tests that drop it and start fresh processes as a user would:
#   - `tiny_omniglot_run` below: the shared run is trained by the command line with the
#     default device count, so every test that loads it (test_runs, test_fail_loud,
#     test_uncertainty, test_paper_table, test_readme's "trained-model" block) loads a run
#     of one device per core, and every test that resumes or retrains it here on one
#     device (test_omniglot_experiment, test_run_folder) checks the numbers bit for bit;
#   - test_portable_runs: 1, 2 and 8 devices, trained on one and loaded or resumed on another;
#   - test_cpu_devices: the default count and who decides it;
#   - test_notebooks: the kernels run with the default count.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "1")

# XLA's persistent compilation cache, shared by the test processes, their
# subprocesses (the 8-device child, notebook kernels) and later runs: the many
# tests that build the same step (a run and its resumed twin) compile it once.
# Entries are keyed by the program, so a changed program is compiled afresh.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "vampire_jax_test_xla_cache")
)
# No size limit (JAX's default): a limit turns on JAX's eviction, which on every write
# lists, stats and reads the access time of every entry under one file lock. The suite
# writes ~6,300 programs, so each write scanned up to 6,300 entries (0.44 s at the end,
# measured) while the other worker waited on the lock: ~1,400 CPU-seconds of a 41-minute
# run, growing with the square of the suite's size. Without the limit, a read racing a
# write sees a truncated zlib stream, which JAX reports and compiles afresh.
# Every program, not only those that take a second to compile (JAX's default): the tests
# and their fresh processes build the same small programs again and again (each module's
# are freed when it ends, below), and reading one back takes milliseconds.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

OMNIGLOT_DIR = Path(
  os.environ.get("OMNIGLOT_DIR") or Path(__file__).resolve().parents[2] / "shared/data/omniglot"
)
HAS_OMNIGLOT = (OMNIGLOT_DIR / "images_background.zip").exists()
needs_omniglot = pytest.mark.skipif(
  not HAS_OMNIGLOT, reason=f"Omniglot zips not found in {OMNIGLOT_DIR} (set OMNIGLOT_DIR)"
)


def pytest_configure(config):
  config.addinivalue_line(
    "markers",
    "slow: needs minutes by nature, or 6.5 s or more of one core (tests/slow_tier.txt); the "
    "slow tier (`pytest -m slow`), which CI runs after the README's test command",
  )


# Doctest files that need minutes, in the slow tier: the user guide trains and loads runs.
SLOW_DOCTEST_FILES = ("user_guide.md",)

# Tests measured at 6.5 s or more each (idle, XLA's test cache empty; docs/development.md),
# in the slow tier without a mark in their files: one test id a line, or a test's name
# without its parameters for all of them.
SLOW_TIER_LIST = Path(__file__).with_name("slow_tier.txt")


def slow_tier_ids(path: Path = SLOW_TIER_LIST) -> set[str]:
  lines = (line.strip() for line in path.read_text().splitlines())
  return {line for line in lines if line and not line.startswith("#")}


@functools.cache
def _source(path: Path) -> str:
  return path.read_text() if path.exists() else ""


def stale_slow_tier_lines(
  listed, collected, root: Path, partly_selected=()
) -> list[tuple[str, str]]:
  """The lines of the slow tier's list that name no test, each with what it names that is not.

  A line ("file::name" or "file::name[parameters]") is stale when its file does not exist,
  when the file defines no test `name`, or when it names parameters and this run collected
  `name` (`collected`: the node ids) with others only. Checked by name in its file, so that
  running some of a file's tests is no error; parameters are not checked for the tests in
  `partly_selected` ("file::name", those the command line named with parameters).
  """
  collected = set(collected)
  by_test: dict[str, list[str]] = {}
  for node_id in sorted(collected):
    by_test.setdefault(node_id.split("[")[0], []).append(node_id.split("::")[-1])
  stale = []
  for line in listed:
    file, _, rest = line.partition("::")
    base = line.split("[")[0]
    name = base.split("::")[-1]
    if not (root / file).is_file():
      stale.append((line, f"no file {file}"))
    elif not rest or not re.search(
      rf"^\s*(async\s+)?(def|class)\s+{re.escape(name)}\b", _source(root / file), re.MULTILINE
    ):
      stale.append((line, f"{file} defines no test {name or '(no name)'}"))
    elif line != base and line not in collected and base in by_test:
      if base not in set(partly_selected):
        stale.append((line, f"no such parameters: collected {', '.join(by_test[base])}"))
  return stale


def _partly_selected(config) -> set[str]:
  """The tests ("file::name") that the command line named with parameters: only those ran."""
  root = Path(str(config.rootpath))
  chosen = set()
  for arg in config.args:
    if "::" in arg and "[" in arg:
      path = Path(arg.split("::")[0]).resolve()
      relative = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
      chosen.add(relative + "::" + arg.split("::", 1)[1].split("[")[0])
  return chosen


def pytest_collection_modifyitems(config, items):
  listed = slow_tier_ids()
  for item in items:
    base = item.nodeid.split("[")[0]
    if Path(str(item.fspath)).name in SLOW_DOCTEST_FILES:
      item.add_marker(pytest.mark.slow)
    for test_id in (item.nodeid, base):
      if test_id in listed:
        item.add_marker(pytest.mark.slow)
  # A listed test that was renamed or deleted, or whose parameters changed, would fall back to
  # the test command without a word.
  stale = stale_slow_tier_lines(
    sorted(listed),
    [item.nodeid for item in items],
    Path(str(config.rootpath)),
    partly_selected=_partly_selected(config),
  )
  if stale:
    lines = "; ".join(f"{line} ({why})" for line, why in stale)
    raise pytest.UsageError(f"{SLOW_TIER_LIST.name} has lines that name no test: {lines}")


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
  """Frees the programs each test module compiled, once the module is done.

  Every XLA:CPU executable a process holds keeps about six memory maps, and JAX keeps every
  program it compiled while its caches live. One xdist worker runs ~440 tests: it passed the
  kernel's limit of 65,530 maps (`vm.max_map_count`) near the end of the suite and died in
  the middle of loading a program ("Fatal Python error: Aborted" or a segmentation fault in
  `compilation_cache.get_executable_and_time`, in whichever test came then). A module's
  programs are reused within the module, rarely beyond it.
  """
  yield
  import jax

  jax.clear_caches()
  gc.collect()
  maps, limit = Path("/proc/self/maps"), Path("/proc/sys/vm/max_map_count")
  if maps.exists() and limit.exists():  # Linux: say so before the kernel does
    held, most = len(maps.read_bytes().splitlines()), int(limit.read_text())
    assert held < most // 2, f"this test process holds {held} memory maps of {most} after a module"


def made_once(tmp_path_factory, name: str, make) -> Path:
  """A folder `make(folder)` fills once per pytest run, shared by every xdist worker.

  A session fixture runs once per worker: with `-n 2`, what it trains is trained twice. This
  puts the folder beside the workers' own temporary folders, and a file lock lets the first
  worker that asks make it while the others wait, then read it. `make` must leave the
  folder as every reader expects; a test that changes it works on a copy.
  """
  from filelock import FileLock

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the run's folder, above each worker's own
  folder, done = root / name, root / f"{name}.done"
  with FileLock(str(root / f"{name}.lock")):
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      make(folder)
      done.touch()
  return folder


@pytest.fixture(scope="session")
def omniglot_cache(tmp_path_factory):
  """A 28x28 cache built once from the zips, so experiments load it in milliseconds."""
  if not HAS_OMNIGLOT:
    pytest.skip(f"Omniglot zips not found in {OMNIGLOT_DIR}")
  from vampire_jax.data import load_omniglot

  def build(cache):
    load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="zip", print_fn=lambda message: None)

  return made_once(tmp_path_factory, "omniglot_cache", build)


@pytest.fixture(scope="session")
def mini_imagenet_cache(tmp_path_factory):
  """The cache `mini_imagenet_sample` builds from the mini-ImageNet sample's folder."""
  return tmp_path_factory.mktemp("mini_cache")


@pytest.fixture(scope="session")
def mini_imagenet_sample(mini_imagenet_cache):
  """The real mini-ImageNet sample's splits, loaded once from its folder (the tests that use
  it skip with `tests.helpers.needs_mini_imagenet_sample` where it is absent)."""
  from tests.helpers import SAMPLE_DIR
  from vampire_jax import data

  return data.load_mini_imagenet(
    SAMPLE_DIR, cache_dir=mini_imagenet_cache, source="folder", existing_only=True
  )


def tiny_regression_config(algorithm: str = "vampire", **changes):
  """Sine/line regression at the smallest size that trains, validates, checkpoints and tests."""
  from experiments import regression

  settings = dict(
    tasks_per_step=2,
    hidden_sizes=(8, 8),
    num_val_tasks=2,
    num_test_tasks=2,
    eval_every=2,
    checkpoint_every=2,
    log_every=2,
    eval_batch_tasks=2,
  )
  return regression.get_config("quick", algorithm).replace(**{**settings, **changes})


def untrained_regression_run(folder: Path, num_tasks: int):
  """An untrained VAMPIRE regression `vj.Run` (its record as training writes it) in `folder`,
  and `num_tasks` of its validation tasks: what the recalibration tests fit maps on."""
  import json

  import jax

  import vampire_jax as vj
  from experiments import regression
  from vampire_jax._src.core import models
  from vampire_jax.runs import run_folder, run_from_record

  config = tiny_regression_config("vampire", num_mc_test=4)
  problem = regression.make_problem(config)
  record = json.loads(json.dumps(run_folder.run_record(problem, config)))
  network = models.module_from_spec(record["model"])
  learner = run_from_record.test_learner(
    network, record, run_from_record.config_from_record(record)
  )
  meta_params = learner.init(vj.init_params(network, jax.random.key(0), (1, 1)), jax.random.key(1))
  run = vj.Run(folder, record, config, meta_params, learner, step=0)
  return run, vj.draw_tasks(problem, "val", jax.random.key(2), num_tasks)


# A regression comparison of 4 meta-steps on an 8-8 MLP (the run tests of Vampire2, SImPa and
# the other algorithms: test_compare).
TINY_REGRESSION = dict(
  num_meta_steps=4,
  hidden_sizes=(8, 8),
  num_test_tasks=10,
  num_val_tasks=10,
  eval_batch_tasks=10,
  eval_every=4,
  checkpoint_every=4,
  log_every=2,
  num_mc_train=2,
  num_mc_query=2,
  num_mc_test=3,
  tasks_per_step=2,
)


def tiny_omniglot_config(cache_dir, num_meta_steps: int = 6, **changes):
  """VAMPIRE on Omniglot at the smallest size that still exercises everything."""
  from experiments import omniglot

  settings = dict(
    num_filters=8,
    num_inner_steps=1,
    tasks_per_step=2,
    num_meta_steps=num_meta_steps,
    num_val_tasks=4,
    num_test_tasks=6,
    eval_batch_tasks=3,
    eval_every=3,
    checkpoint_every=3,
    log_every=3,
    num_mc_test=2,
    data_dir=str(OMNIGLOT_DIR),
    cache_dir=str(cache_dir),
  )
  return omniglot.get_config("quick", "vampire").replace(**{**settings, **changes})


REPO = Path(__file__).resolve().parents[1]


def user_env(**variables) -> dict:
  """The environment a user's shell gives a command: none of this suite's device count."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
  return dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **variables)


# `tiny_omniglot_config`'s settings as the command line's flags.
TINY_OMNIGLOT_FLAGS = [
  "--preset", "quick", "--num-filters", "8", "--num-inner-steps", "1", "--tasks-per-step", "2",
  "--num-meta-steps", "6", "--num-val-tasks", "4", "--num-test-tasks", "6",
  "--eval-batch-tasks", "3", "--eval-every", "3", "--checkpoint-every", "3",
  "--log-every", "3", "--num-mc-test", "2", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_omniglot_run(omniglot_cache, tmp_path_factory):
  """`(workdir, config, results)` of one tiny trained VAMPIRE run, shared by the tests.

  Trained once per pytest run (`made_once`) as a user trains: `python -m
  experiments.omniglot` in a fresh process with the default device count (one per core; 2
  tasks a step, so on two cores each device holds one task). The tests load it, or resume
  and retrain copies of it, in their own process on one device. Read only: a test that
  writes works on a copy.
  """
  import json
  import subprocess
  import sys

  config = tiny_omniglot_config(omniglot_cache)

  def train(workdir):
    command = [sys.executable, "-m", "experiments.omniglot", *TINY_OMNIGLOT_FLAGS]
    command += ["--data-dir", config.data_dir, "--cache-dir", config.cache_dir]
    done = subprocess.run(
      [*command, "--workdir", str(workdir)],
      env=user_env(),
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]

  workdir = made_once(tmp_path_factory, "tiny_run", train)
  results = json.loads((workdir / "results.json").read_text())
  from vampire_jax.runs import config_records

  assert results["config"] == json.loads(json.dumps(config_records.to_record(config)))
  return workdir, config, results


# -- Two untrained learners and their evaluators' results, read by the tests of
# predictive distributions, summaries and refusals (tests/metrics, tests/runs, tests/core).


@pytest.fixture(scope="module")
def regressor():
  """A VAMPIRE regressor (untrained: the numbers are checked against the evaluator's),
  five sine/line tasks, their keys and the evaluator's per-task results."""
  import jax

  import vampire_jax as vj
  from tests.helpers import NOISE
  from vampire_jax.data import sine_line

  model = vj.MLP((16,), 1)
  learner = vj.vampire(
    vj.pure_apply(model), vj.gaussian_nll(NOISE), num_mc_query=4, log_std_init=(-2.0, -1.5)
  )
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1))
  task_keys = jax.random.split(jax.random.key(2), 5)
  tasks = sine_line.tasks_from_keys(task_keys)
  keys = jax.random.split(jax.random.key(3), 5)
  per_task = vj.make_regression_evaluator(learner, NOISE)(meta_params, tasks, keys)
  return learner, meta_params, tasks, task_keys, keys, per_task


@pytest.fixture(scope="module")
def classifier():
  """A 3-way VAMPIRE classifier on 2-D blobs: 4 tasks of 6 queries, and its per-task results."""
  import jax
  import jax.numpy as jnp

  import vampire_jax as vj

  model = vj.MLP((8,), 3)
  learner = vj.vampire(vj.pure_apply(model), vj.categorical_nll, num_mc_query=4)
  meta_params = learner.init(vj.init_params(model, jax.random.key(15), (1, 2)), jax.random.key(16))
  blobs = jax.random.normal(jax.random.key(14), (4, 6, 2))
  labels = jnp.tile(jnp.arange(3), (4, 2))  # [4, 6]
  tasks = vj.Task(blobs + labels[..., None], labels, blobs + 2 * labels[..., None], labels)
  keys = jax.random.split(jax.random.key(17), 4)
  per_task = vj.make_classification_evaluator(learner)(meta_params, tasks, keys)
  return learner, meta_params, tasks, keys, per_task
