"""The public API is a decision: the pinned list of names, a private inside, the layers' rules,
and old import paths that warn once and still work (issue 43)."""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import vampire_jax as vj
from vampire_jax._src import deprecations
from vampire_jax.runs import experiment_configs

REPO = Path(__file__).resolve().parents[2]


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
  # Recalibration of a learner's predictive (a run's: vj.recalibrate).
  "fit_recalibration",
  "recalibrated_learner",
  # Training runs.
  "RunConfig",
  "Schedule",
  "Evaluation",
  "Speed",
  "AlgorithmSpec",
  "specs",
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
  "runs",
  "backend",
  "metrics",
)


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
from vampire_jax.runs import run_folder
report["patched"] = run_folder.read_json == "patched"
print(json.dumps(report))
"""


def _import_graph():
  spec = importlib.util.spec_from_file_location("import_graph", REPO / "docs" / "import_graph.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _imported_modules(path: Path) -> list[str]:
  """The modules the file at `path` imports, anywhere in it (a function's own imports too):
  `import a.b`, `from a import b` (as `a` and `a.b`), and `importlib.import_module("a.b")` or
  `__import__("a.b")` of a string (of an f-string: its leading text)."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.ImportFrom):  # relative: resolved from the file's package
      package = path.relative_to(REPO).parent.parts
      base = ".".join(
        package[: len(package) - node.level + 1] + ((node.module,) if node.module else ())
      )
      found += [base] + [f"{base}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.Call) and node.args:
      function = node.func
      name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
      first = node.args[0]
      if isinstance(first, ast.JoinedStr) and first.values:
        first = first.values[0]
      if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
        found.append(str(first.value))
  return found


def _private(module: str) -> bool:
  return module == "vampire_jax._src" or module.startswith("vampire_jax._src.")


def test_the_public_names_are_the_pinned_list():
  assert tuple(vj.__all__) == PUBLIC_API
  assert len(PUBLIC_API) == len(set(PUBLIC_API)) == 107
  # An old module path imported earlier in this process (`vampire_jax.meta_step`, issue 49's
  # deprecation shims, as test_old_import_paths does) is an attribute of the package too.
  old_modules = {n for n in deprecations.MOVED_MODULES if f"vampire_jax.{n}" in sys.modules}
  public = {name for name in vars(vj) if not name.startswith("_")} - old_modules
  assert public - set(PUBLIC_API) == set(), "a public attribute that __all__ does not list"


def test_the_public_names_come_from_the_layers_below_the_top():
  layers = ("vampire_jax._src.", "vampire_jax.data", "vampire_jax.baselines", "vampire_jax.runs")
  for name in PUBLIC_API:
    module = getattr(getattr(vj, name), "__module__", None) or getattr(vj, name).__name__
    top = ("vampire_jax.specs", "vampire_jax.backend", "vampire_jax.metrics")  # re-exports
    assert module.startswith(layers + top), (name, module)
  # The modules at the top of the package only re-export (no `def` or `class` of their own).
  for path in (REPO / "vampire_jax").glob("*.py"):
    tree = ast.parse(path.read_text())
    defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert path.name == "__init__.py" and len(defined) == 1 or not defined, path.name


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
    "vampire_jax/runs/experiment_configs.py: vampire_jax.configs",
    "vampire_jax/runs/experiment_configs.py: vampire_jax.config",
    "vampire_jax/runs/run_folder/record.py: vampire_jax.models",
    "vampire_jax/_src/core/models.py: vampire_jax.models",
    "tests/runs/test_run_from_record.py: vampire_jax.configs",
    "tests/runs/test_run_from_record.py: vampire_jax.models",
    # Names that left a module whose old path still works (issue 49).
    "tests/project/test_deprecations.py: vampire_jax.meta_step",
    "tests/project/test_deprecations.py: vampire_jax.calibration",
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
      assert recorded == f"vampire_jax.runs.experiment_configs.{name}"


def test_the_layers_import_downwards_only_and_have_no_cycles():
  graph = _import_graph()
  edges = graph.graph(None, REPO)
  assert graph.upward_arrows(edges) == []
  assert graph.cycles(edges) == []
  # The rule is checked: an import of runs/ from core/ is an upward arrow.
  edges["vampire_jax._src.core.gaussian"] = {"vampire_jax.runs.loop"}
  assert graph.upward_arrows(edges) == [("vampire_jax._src.core.gaussian", "vampire_jax.runs.loop")]


def test_the_scripts_use_public_names_only():
  """What the experiments and benchmarks need is public (`vj.*`, `vampire_jax.data`,
  `.baselines`, `.runs`, `.specs`, `.backend`, `.metrics`); none imports `vampire_jax._src`."""
  scripts = [p for folder in ("experiments", "benchmarks") for p in (REPO / folder).rglob("*.py")]
  assert len(scripts) > 40  # both folders were read
  found = [
    f"{p.relative_to(REPO)}: {m}"
    for p in sorted(scripts)
    for m in _imported_modules(p)
    if _private(m)
  ]
  assert found == []


def test_nothing_under_src_imports_a_public_package():
  """The private inside is below every public module: nothing under `vampire_jax/_src`
  imports the top-level `vampire_jax` or a public module of it (`data`, `baselines`, `runs`,
  `specs`, `backend`, `metrics`), each of which imports `_src`."""
  found = [
    f"{p.relative_to(REPO)}: {m}"
    for p in sorted((REPO / "vampire_jax" / "_src").rglob("*.py"))
    for m in _imported_modules(p)
    if (m == "vampire_jax" or m.startswith("vampire_jax.")) and not _private(m)
  ]
  # The stand-in of an old module path asks the top level's `__all__` when an old name is
  # used (`deprecations._ShadowedModule`), long after every module has been imported.
  assert found == ["vampire_jax/_src/deprecations.py: vampire_jax"]


def test_public_docstrings_point_at_public_names_only():
  """No public docstring (vj's or vj.baselines') names a `_src` module."""
  import inspect

  import vampire_jax.baselines as baselines

  named = [(name, getattr(vj, name)) for name in vj.__all__]
  named += [(f"baselines.{name}", getattr(baselines, name)) for name in baselines.__all__]
  private = {name for name, obj in named if "_src" in (inspect.getdoc(obj) or "")}
  assert private == set()


def test_the_api_page_describes_a_namedtuples_fields_once():
  """`Gaussian.mean` and `.log_std` are described once, by their own entries: docs/conf.py
  drops the class's "Attributes:" lines and gives each field's entry its description."""
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
