"""The library stands alone: the wheel holds `vampire_jax` only, a run folder loads and
predicts without the experiments, and the public names are listed once.

The full check (a wheel built from a clean clone, installed alone in a new venv) is in
BUILD_NOTES.md, "Packaging"; the subprocess test below is its fast stand-in: it blocks
the imports that only a clone with the extras has.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import jax
import numpy as np
import setuptools
import tomllib

import vampire_jax as vj
from experiments import regression
from vampire_jax._src import deprecations
from vampire_jax.runs import experiment_configs as configs_lib
from vampire_jax.runs import run_folder

REPO = Path(__file__).resolve().parents[2]


# What the wheel alone does not have: the experiments and benchmarks (a clone's), and
# the extras' packages (figures, TFDS, TensorFlow, logs, progress bars). Pillow is a
# dependency: the image preprocessing uses it.
NOT_IN_THE_WHEEL = (
  "experiments",
  "benchmarks",
  "tensorflow",
  "tensorflow_datasets",
  "matplotlib",
  "tensorboardX",
  "tqdm",
)


# Run first in a script: as if only the wheel were installed, the packages of
# NOT_IN_THE_WHEEL are not found.
WHEEL_ALONE = textwrap.dedent(f"""
    import sys
    BLOCKED = {NOT_IN_THE_WHEEL!r}

    class Hide:
      def __init__(self, finders):
        self.finders = finders

      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
          return None
        for finder in self.finders:
          spec = finder.find_spec(name, path, target)
          if spec is not None:
            return spec
        return None

    sys.meta_path[:] = [Hide(list(sys.meta_path))]
""")


def _run_with_the_wheel_alone(script: str, cwd: Path) -> str:
  """stdout of `WHEEL_ALONE + script` in a fresh process, importing the vampire_jax under test."""
  env = {**os.environ, "PYTHONPATH": str(Path(vj.__file__).parents[1])}
  done = subprocess.run(
    [sys.executable, "-c", WHEEL_ALONE + textwrap.dedent(script)],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def _tiny_regression_run(workdir: Path):
  config = regression.get_config("quick", "vampire").replace(
    hidden_sizes=(8, 8, 8),
    num_meta_steps=2,
    num_inner_steps=1,
    tasks_per_step=2,
    num_mc_train=2,
    num_mc_query=2,
    num_mc_test=3,
    num_val_tasks=2,
    num_test_tasks=2,
    eval_batch_tasks=2,
    eval_every=2,
    checkpoint_every=2,
    log_every=2,
  )
  vj.train_and_evaluate(
    regression.make_problem(config), config, workdir, progress=False, print_fn=lambda message: None
  )
  return config


# A distribution's import name where it differs from its pip name.
IMPORT_NAME = {"orbax-checkpoint": "orbax", "pillow": "PIL"}


def test_importing_the_library_leaves_the_heavy_packages_until_they_are_used():
  """`import vampire_jax` stays near `import jax, flax, optax` (benchmarks/import_time.py):
  distrax (TFP's JAX substrate, about 5 s) loads on a predictive's first call, and the
  experiments' packages never load with the library."""
  import subprocess
  import sys

  heavy = ["distrax", "tensorflow_probability", "tensorflow", "matplotlib", "tqdm", "equinox"]
  code = f"import sys, vampire_jax; print([m for m in {heavy!r} if m in sys.modules])"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
  code = (
    "import sys, jax, vampire_jax as vj; "
    "vj.predictive_distribution(jax.numpy.zeros((2, 3, 1)), vj.gaussian_nll(0.3)); "
    "print('distrax' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "True"


def test_a_run_folder_loads_and_predicts_with_the_library_alone(tmp_path):
  run_dir = tmp_path / "run"
  config = _tiny_regression_run(run_dir)
  # The same run as a folder written before the configs moved into the library.
  old_dir = tmp_path / "old_run"
  shutil.copytree(run_dir, old_dir)
  record = json.loads((old_dir / "run.json").read_text())
  assert record["config_class"] == "vampire_jax.runs.experiment_configs.RegressionConfig"
  record["config_class"] = "experiments.configs.RegressionConfig"
  (old_dir / "run.json").write_text(json.dumps(record))
  run_folder.check_resumable(old_dir, config)  # the same config class: it may be resumed

  x = np.linspace(-5, 5, 12, dtype=np.float32)[:, None]
  y = np.sin(x)
  expected = np.asarray(vj.load_run(run_dir).predict(x[:5], y[:5], x[5:], jax.random.key(3)))
  # The test's NLL of the same task and key: what run.predictive's log_prob must give.
  run = vj.load_run(run_dir)
  task = vj.Task(x[None, :5], y[None, :5], x[None, 5:], np.sin(x[None, 5:]))
  evaluate = vj.make_regression_evaluator(run.learner, run.noise_std)
  reported_nll = float(evaluate(run.meta_params, task, jax.random.key(3)[None]).nll[0])

  script = textwrap.dedent("""
      import dataclasses, json, warnings
      # load_run's warning when it falls back to a stand-in config class.
      warnings.filterwarnings("error", message="cannot import the run's config class")
      import jax, numpy as np
      import vampire_jax as vj
      x = np.linspace(-5, 5, 12, dtype=np.float32)[:, None]
      out = {}
      for name in ("run", "old_run"):
        run = vj.load_run(name)
        out[name] = {"config": f"{type(run.config).__module__}.{type(run.config).__name__}",
                     "fields": dataclasses.asdict(run.config),
                     "predictions": np.asarray(run.predict(x[:5], np.sin(x[:5]), x[5:],
                                                           jax.random.key(3))).tolist(),
                     "nll": -float(run.predictive(x[:5], np.sin(x[:5]), x[5:], jax.random.key(3))
                                   .log_prob(np.sin(x[5:])).mean())}
      out["loaded"] = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
      drawing = np.full((2, 105, 105), 255, np.uint8)
      drawing[:, 40:60, 20:80] = 0  # a dark stroke on white paper
      out["preprocessed"] = vj.data.preprocess_omniglot(drawing).tolist()
      print(json.dumps(out))
  """)
  # From the folder that holds the runs, outside the repository, importing the
  # vampire_jax under test (the blocker keeps the clone's other packages out).
  stdout = _run_with_the_wheel_alone(script, tmp_path)
  result = json.loads(stdout.strip().splitlines()[-1])
  assert result["loaded"] == []
  drawing = np.full((2, 105, 105), 255, np.uint8)
  drawing[:, 40:60, 20:80] = 0
  np.testing.assert_array_equal(result["preprocessed"], vj.data.preprocess_omniglot(drawing))
  for name in ("run", "old_run"):
    assert result[name]["config"] == "vampire_jax.runs.experiment_configs.RegressionConfig", result[
      name
    ]
    assert result[name]["fields"] == json.loads(json.dumps(dataclasses.asdict(config)))
    predictions = np.asarray(result[name]["predictions"])
    assert predictions.shape == (config.algorithm.num_mc_test, 7, 1)
    np.testing.assert_allclose(predictions, expected, rtol=1e-5, atol=1e-6)
    assert abs(result[name]["nll"] - reported_nll) < 1e-5, (result[name]["nll"], reported_nll)


def test_the_wheel_holds_the_library_only_with_its_version_and_py_typed():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())
  found = project["tool"]["setuptools"]["packages"]["find"]
  packages = setuptools.find_packages(where=str(REPO), include=found["include"])
  assert {"vampire_jax", "vampire_jax.baselines", "vampire_jax.data"} <= set(packages)
  assert all(p.split(".")[0] == "vampire_jax" for p in packages), packages
  assert project["project"]["dynamic"] == ["version"]
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vampire_jax.__version__"}
  citation = (REPO / "CITATION.cff").read_text()
  assert f"\nversion: {vj.__version__}\n" in citation  # the software's version, once
  assert "py.typed" in project["tool"]["setuptools"]["package-data"]["vampire_jax"]
  assert (REPO / "vampire_jax" / "py.typed").is_file()
  # The core dependencies are what the library uses: no extra's package, and Pillow (the
  # image preprocessing and the loaders use it; `vj.data.preprocess_omniglot` needs it).
  core = " ".join(project["project"]["dependencies"]).lower()
  for extra in ("tensorflow", "matplotlib", "tensorboardx", "tqdm"):
    assert extra not in core, extra
  assert "pillow" in core


def test_the_zoo_stays_out_of_the_wheel_and_the_sdist(tmp_path):
  """`python -m build`, as the test command runs it: zoo/'s trained runs are for a clone
  (`vj.load_run("zoo/<cell>")`), not for every install of the library."""
  assert (REPO / "zoo" / "manifest.json").is_file()
  done = subprocess.run(
    [sys.executable, "-m", "build", "-q", "-o", str(tmp_path), str(REPO)],
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  (wheel,) = tmp_path.glob("*.whl")
  (sdist,) = tmp_path.glob("*.tar.gz")
  in_wheel = zipfile.ZipFile(wheel).namelist()
  with tarfile.open(sdist) as tar:
    in_sdist = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
  assert "vampire_jax/__init__.py" in in_wheel and "vampire_jax/__init__.py" in in_sdist
  for names in (in_wheel, in_sdist):
    assert [n for n in names if n.startswith("zoo/") or "manifest.json" in n] == []


def test_all_lists_every_public_name_once():
  """Order-independent: an old module path (one of `deprecations.MOVED_MODULES`) imported
  earlier in this process, as tests/project/test_deprecations.py does, is set on the package by
  Python's import system, as for any submodule; it is a deprecated alias, not a public name.
  CI failed on this when xdist ran that test first on the same worker (stop 63)."""
  assert len(vj.__all__) == len(set(vj.__all__))
  assert [n for n in vj.__all__ if not hasattr(vj, n)] == []
  public = {n for n in vars(vj) if not n.startswith("_")}
  old_paths = {
    n for n in deprecations.MOVED_MODULES if vars(vj).get(n) is sys.modules.get(f"vampire_jax.{n}")
  }
  assert sorted(public - set(vj.__all__) - old_paths) == []


def test_old_run_folders_name_the_library_configs():
  for name in ("OmniglotConfig", "MiniImagenetConfig", "FeaturesConfig", "RegressionConfig"):
    assert (
      configs_lib.recorded_class_name(f"experiments.configs.{name}")
      == f"vampire_jax.runs.experiment_configs.{name}"
    )
  # Other names, and the experiments' preset functions, are left as they are.
  for name in (
    "experiments.configs.get_config",
    "my_project.MyConfig",
    "vampire_jax.runs.experiment_configs.OmniglotConfig",
  ):
    assert configs_lib.recorded_class_name(name) == name


def test_every_runtime_dependency_is_imported_by_the_library():
  """Declared equals used: each of `dependencies` is imported somewhere in vampire_jax/."""
  import re

  pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
  names = [
    re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0] for spec in pyproject["project"]["dependencies"]
  ]
  source = "\n".join(path.read_text() for path in (REPO / "vampire_jax").rglob("*.py"))
  unused = []
  for name in names:
    module = IMPORT_NAME.get(name.lower(), name.replace("-", "_"))
    if not re.search(rf"^\s*(import|from) {re.escape(module)}\b", source, flags=re.M):
      unused.append(f"{name} (import {module})")
  assert not unused, f"declared in pyproject.toml but never imported by vampire_jax/: {unused}"
  assert {"distrax", "chex"} <= set(names)  # the design card's stack, at work in the library


def test_an_omniglot_runs_predictive_with_the_wheel_alone(tiny_omniglot_run, tmp_path):
  """`Run.predictive` on a trained Omniglot run, in a process without the clone's packages:
  its log_prob is the evaluator's NLL of the same task and key."""
  run = vj.load_run(tiny_omniglot_run[0])
  rng = np.random.default_rng(0)
  support_x = rng.uniform(0, 1, (5,) + run.input_shape).astype(np.float32)
  query_x = rng.uniform(0, 1, (10,) + run.input_shape).astype(np.float32)
  support_y, query_y = np.arange(5), np.arange(10) % 5
  task = vj.Task(support_x[None], support_y[None], query_x[None], query_y[None])
  evaluate = vj.make_classification_evaluator(run.learner)
  reported = float(evaluate(run.meta_params, task, jax.random.key(8)[None]).nll[0])
  np.savez(tmp_path / "omniglot_task.npz", support_x=support_x, query_x=query_x)
  stdout = _run_with_the_wheel_alone(
    f"""
    import jax, numpy as np
    import vampire_jax as vj
    arrays = np.load({str(tmp_path / "omniglot_task.npz")!r})
    run = vj.load_run({str(tiny_omniglot_run[0])!r})
    dist = run.predictive(arrays["support_x"], np.arange(5), arrays["query_x"], jax.random.key(8))
    print(type(dist).__name__, -float(dist.log_prob(np.arange(10) % 5).mean()))
    print(sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED)))
    """,
    tmp_path,
  )
  first, loaded = stdout.strip().splitlines()[-2:]
  name, nll = first.split()
  assert name == "PredictiveCategorical" and abs(float(nll) - reported) < 1e-5, (first, reported)
  assert loaded == "[]"
