"""The test tree mirrors the library: a module's tests are found by its name."""

import os
from pathlib import Path

import pytest

from tests.conftest import REPO

# Where the tests of each part of the library live (docs/development.md, "Where a module's
# tests are").
LAYERS = {
  "vampire_jax/_src/core": "core",
  "vampire_jax/_src/metrics": "metrics",
  "vampire_jax/baselines": "baselines",
  "vampire_jax/data": "data",
  "vampire_jax/runs/run_folder": "run_folder",
  "vampire_jax/runs": "runs",
  "vampire_jax/_src": "project",
  "vampire_jax": "project",
}


def expected_test_file(module: Path) -> Path:
  """tests/<layer>/test_<name>.py for vampire_jax/.../<name>.py (a leading _ dropped)."""
  folder = module.parent.relative_to(REPO).as_posix()
  return REPO / "tests" / LAYERS[folder] / f"test_{module.stem.lstrip('_')}.py"


def library_modules() -> list[Path]:
  return sorted(p for p in (REPO / "vampire_jax").rglob("*.py") if p.name != "__init__.py")


def test_every_library_folder_has_a_test_folder():
  folders = {p.parent.relative_to(REPO).as_posix() for p in library_modules()}
  assert folders <= set(LAYERS), f"no test folder for {sorted(folders - set(LAYERS))}"
  for layer in set(LAYERS.values()):
    assert (REPO / "tests" / layer / "__init__.py").is_file(), layer


def test_at_least_80_percent_of_the_modules_have_a_test_file_of_their_name():
  modules = library_modules()
  without = [m.relative_to(REPO).as_posix() for m in modules if not expected_test_file(m).exists()]
  share = 1 - len(without) / len(modules)
  assert share >= 0.8, f"{share:.0%} of {len(modules)} modules; without: {without}"


def test_no_test_file_sits_at_the_top_of_the_tests_folder():
  assert sorted(p.name for p in (REPO / "tests").glob("test_*.py")) == []


def test_the_shared_data_paths_name_the_shared_data_folder():
  """A wrong path would skip every test that needs the data, silently."""
  from tests import conftest, helpers

  shared = REPO.parent / "shared" / "data"
  if not shared.is_dir():
    pytest.skip("no ../shared/data beside the clone")
  expected = {
    "OMNIGLOT_DIR": (conftest.OMNIGLOT_DIR, shared / "omniglot"),
    "OMNIGLOT_DIR ": (helpers.DATA_DIR, shared / "omniglot"),
    "MINI_IMAGENET_DIR": (helpers.SAMPLE_DIR, shared / "mini_imagenet_sample"),
  }
  for variable, (path, default) in expected.items():
    if not os.environ.get(variable.strip()):
      assert path.resolve() == default.resolve(), (variable, path)
      assert path.is_dir(), path
  assert helpers.REPO_ROOT == helpers.ROOT == REPO


def test_no_test_folder_shadows_a_package_of_the_repository():
  """A script run from tests/ (tests/sigterm_at_step.py) has tests/ on its path: a folder
  tests/experiments would stand in for the experiments package."""
  packages = {p.parent.name for p in REPO.glob("*/__init__.py")}
  folders = {p.parent.name for p in (REPO / "tests").glob("*/__init__.py")}
  assert folders & packages == set()
