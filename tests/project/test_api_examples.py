"""The API page's `>>>` examples run, as doctests, and the main entry points have one.

The examples assume `import jax`, `import jax.numpy as jnp` and `import vampire_jax as vj`
(the API page says so); each is otherwise self-contained.
"""

import doctest

import jax
import jax.numpy as jnp
import pytest

import vampire_jax as vj

# The entry points a user starts from (the README, the user guide, the docs' index).
ENTRY_POINTS = (
  "gaussian_from_params",
  "sample",
  "kl_divergence",
  "adapt",
  "predict",
  "vampire",
  "make_train_step",
  "summarise",
  "predictive",
  # Issue 59: the API pages of these had no example.
  "load_run",
  "from_nnx",
  "train_and_evaluate",
  "check_inner_loop",
)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_the_entry_points_example_runs(name):
  function = getattr(vj, name)
  finder = doctest.DocTestFinder(recurse=False)
  globs = {"jax": jax, "jnp": jnp, "vj": vj}
  tests = [t for t in finder.find(function, name, globs=globs) if t.examples]
  assert tests, f"vj.{name}'s docstring has no >>> example"
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
  for test in tests:
    runner.run(test)
  assert runner.failures == 0, f"vj.{name}'s example failed (its output is above)"
