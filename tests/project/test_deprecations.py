"""Old import paths of names that left their module: they still work,
with a warning that names the new path.
"""

import importlib
import sys

import pytest

import vampire_jax as vj
from vampire_jax._src import deprecations


@pytest.fixture
def fresh_warnings(monkeypatch):
  """Each old path warns once per process: forget which warned already."""
  monkeypatch.setattr(deprecations, "_warned", set())


@pytest.mark.parametrize(
  "statement, name, home",
  [
    (
      "from vampire_jax.meta_step import make_host_chunked_train_step",
      "make_host_chunked_train_step",
      "vampire_jax._src.core.host_chunked",
    ),
    (
      "from vampire_jax.meta_step import make_host_chunked_meta_step",
      "make_host_chunked_meta_step",
      "vampire_jax._src.core.host_chunked",
    ),
    (
      "from vampire_jax.calibration import PAPER_QUANTILE_LEVELS",
      "PAPER_QUANTILE_LEVELS",
      "vampire_jax._src.metrics.quantile_calibration",
    ),
    (
      "from vampire_jax.data.mini_imagenet import mini_imagenet_builder_class",
      "mini_imagenet_builder_class",
      "vampire_jax.data",
    ),
  ],
)
def test_a_name_that_left_its_old_module_warns_and_works(fresh_warnings, statement, name, home):
  """A name imported from its old module warns once, naming the new path, and is the same
  object as at its new home."""
  namespace = {}
  with pytest.warns(FutureWarning, match=rf"\.{name} is deprecated: use {home}\.{name} "):
    exec(statement, namespace)
  assert namespace[name] is getattr(importlib.import_module(home), name)


def test_the_old_module_path_vampire_jax_predictive_serves_its_names_and_keeps_the_function(
  fresh_warnings,
):
  """`import vampire_jax.predictive` and `from vampire_jax.predictive import
  predictive_interval` (the module's path until 0.3) work, warning with the new path; the
  top-level `vj.predictive` stays the function; unknown names are refused naming the module."""
  namespace = {}
  with pytest.warns(
    FutureWarning,
    match=r"vampire_jax\.predictive\.predictive_interval is deprecated: use "
    r"vampire_jax\.predictive_interval ",
  ):
    exec("from vampire_jax.predictive import predictive_interval", namespace)
  assert namespace["predictive_interval"] is vj.predictive_interval
  exec("import vampire_jax.predictive", namespace)
  # The top-level name stays the function, as in every release.
  assert namespace["vampire_jax"].predictive is vj.predictive and callable(vj.predictive)
  with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
    exec("from vampire_jax.predictive import no_such_name", namespace)
  with pytest.raises(AttributeError, match="an old path of vampire_jax._src.metrics.predictive"):
    sys.modules["vampire_jax.predictive"].no_such_name
