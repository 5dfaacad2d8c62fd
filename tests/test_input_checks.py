"""The shared argument checks of `vampire_jax/_src/core/input_checks.py`, where factories use them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError

MODEL = vj.MLP((4,), 1)
APPLY = vj.pure_apply(MODEL)
NLL = vj.gaussian_nll(0.3)
LOSS = vj.loss_from_apply(APPLY, NLL)
X = jnp.zeros((3, 1))
Y = jnp.zeros((3, 1))


def _params():
  return vj.init_params(MODEL, jax.random.key(0), (1, 1))


def _equinox_module():
  eqx = pytest.importorskip("equinox")
  return eqx.nn.Linear(1, 1, key=jax.random.key(0))


# Every public function that takes a switch: its name -> (its switches, call(**switch)).
FACTORIES = {
  "vampire": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.vampire(APPLY, NLL, **f),
  ),
  "vampire2": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.vampire2(APPLY, NLL, **f),
  ),
  "maml": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.maml(APPLY, NLL, **f),
  ),
  "platipus": (("first_order", "unroll_steps"), lambda **f: vj.baselines.platipus(APPLY, NLL, **f)),
  "bmaml": (("first_order", "unroll_steps"), lambda **f: vj.baselines.bmaml(APPLY, NLL, **f)),
  "abml": (("first_order", "unroll_steps"), lambda **f: vj.baselines.abml(APPLY, NLL, **f)),
  "simpa": (
    ("first_order", "unroll_steps"),
    lambda **f: vj.baselines.simpa(APPLY, NLL, tasks_per_step=2, **f),
  ),
  "adapt": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.adapt(
      vj.gaussian_from_params(_params(), jax.random.key(1)),
      X,
      Y,
      jax.random.key(2),
      loss_fn=LOSS,
      num_steps=1,
      inner_lr=0.01,
      **f,
    ),
  ),
  "maml_adapt": (
    ("first_order", "unroll_steps", "remat", "backtracking"),
    lambda **f: vj.maml_adapt(_params(), X, Y, loss_fn=LOSS, num_steps=1, inner_lr=0.01, **f),
  ),
  "shifted_mean": (
    ("first_order",),
    lambda **f: vj.baselines.shifted_mean(
      _params(), jax.tree.map(jnp.ones_like, _params()), X, Y, loss_fn=LOSS, **f
    ),
  ),
  "svgd_adapt": (
    ("first_order", "unroll_steps"),
    lambda **f: vj.baselines.svgd_adapt(
      vj.baselines.init_particles(_params(), jax.random.key(1), 2),
      X,
      Y,
      loss_fn=LOSS,
      num_steps=1,
      inner_lr=0.01,
      **f,
    ),
  ),
  "meta_optimizer": (
    ("clip_separately",),
    lambda **f: vj.meta_optimizer(tasks_per_step=2, clip_norm=1.0, **f),
  ),
  "from_equinox": (("per_example",), lambda **f: vj.from_equinox(_equinox_module(), **f)),
}
CASES = [(where, name) for where, (names, _) in FACTORIES.items() for name in names]
NOT_BOOLS = [("False", "a str"), (0, "an int"), (1.0, "a float"), (None, "None")]


@pytest.mark.parametrize("value, kind", NOT_BOOLS, ids=lambda v: repr(v))
@pytest.mark.parametrize("where, name", CASES, ids=[f"{w}-{n}" for w, n in CASES])
def test_a_switch_refuses_anything_but_a_bool(where, name, value, kind):
  """Each factory refuses a string, a number or None for a switch, naming itself, the
  argument, the value and its kind, and what it takes (True or False)."""
  with pytest.raises(InputError) as raised:
    FACTORIES[where][1](**{name: value})
  message = str(raised.value)
  assert "\n" not in message
  assert re.search(rf"\b{where}\b", message), message
  assert name in message and "True or False" in message, message
  assert repr(value) in message and kind in message, message


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)], ids=repr)
def test_a_switch_takes_python_and_numpy_bools(value):
  """`checks.flag` takes True and False, and numpy's bools."""
  checks.flag("f", "first_order", value)
  vj.vampire(APPLY, NLL, first_order=value, unroll_steps=value, remat=value, backtracking=value)
