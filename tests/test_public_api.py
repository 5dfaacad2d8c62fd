"""The public API is a decision: the pinned list of names, a private inside, the layers' rules,
and old import paths that warn once and still work (issue 43)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import vampire_jax as vj
from vampire_jax._src import deprecations
from vampire_jax._src.runs import experiment_configs

REPO = Path(__file__).resolve().parents[1]

# Adding a name here is a decision: it is then kept, or deprecated through
# `vampire_jax/_src/deprecations.py`.
PUBLIC_API = (
  # Distributions over weights.
  "Gaussian",
  "gaussian_from_params",
  "gaussian_from_distrax",
  "to_distrax",
  "kl_divergence",
  "kl_step_factor",
  "point_mass",
  "sample",
  # Likelihoods.
  "categorical_nll",
  "distribution_nll",
  "gaussian_nll",
  "loss_from_apply",
  # Networks.
  "MLP",
  "Conv4",
  "conv4_mini_imagenet",
  "conv4_omniglot",
  "init_params",
  "local_reparameterization",
  "mixed_precision",
  "pure_apply",
  "from_equinox",
  "from_nnx",
  # Tasks.
  "Task",
  # Adaptation to a task.
  "adapt",
  "expected_nll",
  "maml_adapt",
  "predict",
  "variational_free_energy",
  # Learners.
  "InnerLoopSettings",
  "MetaLearner",
  "maml",
  "query_loss",
  "vampire",
  "vampire2",
  # Diagnostics.
  "InnerLoopReport",
  "check_inner_loop",
  "debug_nonfinite",
  "largest_curvature",
  # The meta-step.
  "MetaOptimizer",
  "MetaState",
  "classification_metrics",
  "init_meta_state",
  "make_meta_gradient",
  "make_meta_step",
  "make_train_step",
  "meta_lr_schedule",
  "meta_optimizer",
  # Several devices.
  "initialize_multihost",
  "replicate",
  "shard_tasks",
  "task_mesh",
  "use_all_cpu_cores",
  # Evaluation.
  "ClassificationEval",
  "OpenSetEval",
  "RegressionEval",
  "make_classification_evaluator",
  "make_open_set_evaluator",
  "make_regression_evaluator",
  # Calibration.
  "ReliabilityBins",
  "RiskCoverage",
  "classification_calibration",
  "mean_confidence_interval",
  "risk_coverage",
  "QuantileCalibration",
  "paper_quantile_calibration",
  "regression_quantile_calibration",
  # Uncertainty and open-set detection.
  "Uncertainty",
  "auroc",
  "entropy",
  "open_set_summary",
  "regression_uncertainty",
  "roc_curve",
  "uncertainty",
  # The predictive distribution.
  "predictive",
  "predictive_distribution",
  "predictive_interval",
  # Training runs.
  "RunConfig",
  "Problem",
  "draw_tasks",
  "ProblemKind",
  "summarise",
  "test_summary_line",
  "TrainingInterrupted",
  "train_and_evaluate",
  "Run",
  "load_run",
  "recalibrate",
  # Errors.
  "UserError",
  "ConfigError",
  "DataError",
  "DivergenceError",
  "InputError",
  "MissingDataError",
  "RunFolderError",
  "StorageError",
  # Subpackages.
  "data",
  "baselines",
)


def test_the_public_names_are_the_pinned_list():
  assert tuple(vj.__all__) == PUBLIC_API
  assert len(PUBLIC_API) == len(set(PUBLIC_API)) == 97  # "about 90"
  # An old module path imported earlier in this process (`vampire_jax.meta_step`, issue 49's
  # deprecation shims, as test_old_import_paths does) is an attribute of the package too.
  old_modules = {n for n in deprecations.MOVED_MODULES if f"vampire_jax.{n}" in sys.modules}
  public = {name for name in vars(vj) if not name.startswith("_")} - old_modules
  assert public - set(PUBLIC_API) == set(), "a public attribute that __all__ does not list"


def test_the_public_names_come_from_the_private_inside():
  for name in PUBLIC_API:
    module = getattr(getattr(vj, name), "__module__", None) or getattr(vj, name).__name__
    assert module.startswith(("vampire_jax._src.", "vampire_jax.data", "vampire_jax.baselines")), (
      name,
      module,
    )
  # No implementation module sits at the top of the package any more.
  assert sorted(p.name for p in (REPO / "vampire_jax").glob("*.py")) == ["__init__.py"]


_OLD_PATHS = r"""
import importlib, json, sys, warnings
warnings.simplefilter("always")
from vampire_jax._src import deprecations
report = {}
for old, new in sorted(deprecations.MOVED_MODULES.items()):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(f"import vampire_jax.{old} as module")  # as a user writes it
    exec(f"from vampire_jax import {old} as again")
    import vampire_jax
    attribute = getattr(vampire_jax, old)
  report[old] = {
    "same": module is again is attribute is sys.modules[new],
    "spec": module.__spec__.name,
    "warnings": [str(w.message) for w in caught if w.category is FutureWarning],
    "filename": [w.filename for w in caught if w.category is FutureWarning],
  }
for name, home in sorted(deprecations.MOVED_NAMES.items()):
  import vampire_jax
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first, second = getattr(vampire_jax, name), getattr(vampire_jax, name)
  report[name] = {
    "same": first is second is getattr(importlib.import_module(home), name),
    "warnings": [str(w.message) for w in caught if w.category is FutureWarning],
    "filename": [w.filename for w in caught if w.category is FutureWarning],
  }
# Patching a module through its old path patches the module itself.
from vampire_jax.run_folder import checkpoints
import vampire_jax.run_folder as old_run_folder
old_run_folder.read_json = "patched"
from vampire_jax._src.runs import run_folder
report["patched"] = run_folder.read_json == "patched"
print(json.dumps(report))
"""


def test_old_module_paths_and_names_warn_once_and_work():
  result = subprocess.run(
    [sys.executable, "-c", _OLD_PATHS],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.splitlines()[-1])
  for old, new in deprecations.MOVED_MODULES.items():
    entry = report[old]
    assert entry["same"], old
    assert entry["spec"] == new, (old, entry["spec"])  # the module keeps its own spec
    assert len(entry["warnings"]) == 1, (old, entry["warnings"])  # once, for three uses
    assert f"vampire_jax.{old} is deprecated" in entry["warnings"][0]
    assert new in entry["warnings"][0]
    assert entry["filename"] == ["<string>"], entry  # the warning points at the user's line
  for name, home in deprecations.MOVED_NAMES.items():
    entry = report[name]
    assert entry["same"], name
    assert entry["warnings"] == [
      f"vampire_jax.{name} is deprecated: use {home}.{name} (the old path works until "
      f"vampire_jax {deprecations.REMOVED_IN})"
    ]
    assert entry["filename"] == ["<string>"], entry
  assert report["patched"]


def test_a_moved_name_is_not_public_and_an_unknown_name_is_an_attribute_error():
  assert set(deprecations.MOVED_NAMES).isdisjoint(PUBLIC_API)
  assert set(deprecations.MOVED_MODULES).isdisjoint(PUBLIC_API)
  try:
    vj.no_such_name
  except AttributeError as error:
    assert "no_such_name" in str(error)
  else:
    raise AssertionError("vj.no_such_name did not raise")


def test_our_own_code_uses_no_old_path():
  """No module, test, benchmark, notebook or page of ours names a moved module or name."""
  moved = "|".join(sorted(deprecations.MOVED_MODULES, key=len, reverse=True))
  names = "|".join(sorted(deprecations.MOVED_NAMES, key=len, reverse=True))
  patterns = [
    re.compile(rf"\bvampire_jax\.({moved})\b"),  # import vampire_jax.gaussian, from ... import
    re.compile(rf"^\s*from vampire_jax import .*\b({moved})\b", re.M),
    re.compile(rf"\bvj\.({moved}|{names})\b"),
  ]
  files = [
    p
    for folder in ("vampire_jax", "experiments", "benchmarks", "tests", "notebooks", "docs")
    for p in (REPO / folder).rglob("*")
    if p.suffix in (".py", ".ipynb", ".md", ".rst")
    and p.name not in ("deprecations.py", "test_public_api.py")
  ] + [REPO / "README.md"]
  found = [
    f"{p.relative_to(REPO)}: {m.group(0)}"
    for p in files
    for pattern in patterns
    for m in pattern.finditer(p.read_text())
  ]
  # Where an old path is named on purpose: the pages that say old paths still work, and
  # the code and tests that read run records of 0.2.0 (`vampire_jax.configs.<Class>`,
  # `vampire_jax.models.<Class>`, `vampire_jax.config.RunConfig`).
  allowed = {
    "vampire_jax/__init__.py: vampire_jax.gaussian",
    "docs/api.rst: vampire_jax.gaussian",
    "docs/structure.md: vampire_jax.gaussian",
    "docs/structure.md: vampire_jax.run_folder",
    "docs/structure.md: vampire_jax.configs",
    "docs/structure.md: vampire_jax.models",
    "docs/structure.md: vj.evaluate_split",
    "docs/structure.md: vj.RunCheckpoints",
    "vampire_jax/_src/runs/experiment_configs.py: vampire_jax.configs",
    "vampire_jax/_src/runs/experiment_configs.py: vampire_jax.config",
    "vampire_jax/_src/runs/run_folder/record.py: vampire_jax.models",
    "vampire_jax/_src/core/models.py: vampire_jax.models",
    "tests/test_old_run_folders.py: vampire_jax.configs",
    "tests/test_old_run_folders.py: vampire_jax.models",
    # Names that left a module whose old path still works (issue 49).
    "tests/test_old_import_paths.py: vampire_jax.meta_step",
    "tests/test_old_import_paths.py: vampire_jax.calibration",
  }
  assert [f for f in found if f not in allowed] == []


def test_the_library_and_the_experiments_import_without_a_deprecation_warning():
  modules = [f"experiments.{p.stem}" for p in sorted((REPO / "experiments").glob("*.py"))]
  code = "import vampire_jax\n" + "".join(f"import {m}\n" for m in modules)
  result = subprocess.run(
    [sys.executable, "-W", "error::FutureWarning", "-c", code],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr[-3000:]


def test_run_records_of_earlier_versions_name_todays_config_classes():
  for name in ("OmniglotConfig", "MiniImagenetConfig", "FeaturesConfig", "RegressionConfig"):
    for old_module in ("vampire_jax.configs", "experiments.configs"):
      recorded = experiment_configs.recorded_class_name(f"{old_module}.{name}")
      assert recorded == f"vampire_jax._src.runs.experiment_configs.{name}"


def _import_graph():
  spec = importlib.util.spec_from_file_location("import_graph", REPO / "docs" / "import_graph.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_layers_import_downwards_only_and_have_no_cycles():
  graph = _import_graph()
  edges = graph.graph(None, REPO)
  assert graph.upward_arrows(edges) == []
  assert graph.cycles(edges) == []
  # The rule is checked: an import of runs/ from core/ is an upward arrow.
  edges["vampire_jax._src.core.gaussian"] = {"vampire_jax._src.runs.loop"}
  assert graph.upward_arrows(edges) == [
    ("vampire_jax._src.core.gaussian", "vampire_jax._src.runs.loop")
  ]


def test_no_library_module_is_over_about_500_lines():
  lengths = {
    p.relative_to(REPO).as_posix(): len(p.read_text().splitlines())
    for p in (REPO / "vampire_jax").rglob("*.py")
  }
  assert {path: n for path, n in lengths.items() if n > 520} == {}


def test_public_docstrings_point_at_public_names_only():
  """Issue 50: `make_meta_gradient`'s entry sent readers to `vampire_jax._src.core.batching`."""
  import inspect

  import vampire_jax.baselines as baselines

  named = [(name, getattr(vj, name)) for name in vj.__all__]
  named += [(f"baselines.{name}", getattr(baselines, name)) for name in baselines.__all__]
  private = {name for name, obj in named if "_src" in (inspect.getdoc(obj) or "")}
  assert private == set()


def test_the_api_page_describes_a_namedtuples_fields_once():
  """Issue 50: `Gaussian.mean` and `.log_std` were described by the class's "Attributes:"
  section and again by their own entries; docs/conf.py keeps the entries."""
  spec = importlib.util.spec_from_file_location("docs_conf", REPO / "docs" / "conf.py")
  conf = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(conf)
  # The class docstring as napoleon hands it on: its "Attributes:" as `:ivar` lines.
  lines = [
    "N(mean, diag(exp(log_std))^2) over a parameter tree.",
    "",
    ":ivar mean: tree of arrays, the network's parameter structure.",
    ":ivar log_std: tree with exactly the structure",
    "   and shapes of `mean`.",
    "",
  ]
  conf._describe_field(None, "class", "vampire_jax.Gaussian", vj.Gaussian, {}, lines)
  assert lines == ["N(mean, diag(exp(log_std))^2) over a parameter tree.", "", ""]
  field = ["Alias for field number 0"]  # the field's own entry keeps its description
  conf._describe_field(None, "attribute", "vampire_jax.Gaussian.mean", None, {}, field)
  assert field == ["tree of arrays, the network's parameter structure."]
