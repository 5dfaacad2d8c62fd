"""The factories of `vampire_jax/_src/core/learners.py`: what they refuse when a learner is built."""

import pytest

import vampire_jax as vj
from vampire_jax._src.core.errors import InputError

APPLY = vj.pure_apply(vj.MLP((4,), 1))
NLL = vj.gaussian_nll(0.3)


@pytest.mark.parametrize("value", ["prior", "standard_normal"])
def test_vampire2_refuses_a_kl_target(value):
  """vj.vampire2 refuses `kl_target` in one line: its target is N(0, I) by definition, and
  vj.vampire takes kl_target="prior"."""
  with pytest.raises(InputError) as raised:
    vj.vampire2(APPLY, NLL, kl_target=value)
  message = str(raised.value)
  assert "\n" not in message
  assert "vampire2" in message and "kl_target" in message and repr(value) in message, message
  assert "N(0, I)" in message and "vj.vampire" in message and "'prior'" in message, message


def test_vampire2_refuses_an_unknown_option_naming_the_options():
  """vj.vampire2 refuses a keyword it does not take in one line naming it and those it takes."""
  with pytest.raises(TypeError) as raised:
    vj.vampire2(APPLY, NLL, unroll_step=True)
  message = str(raised.value)
  assert "vampire2" in message and "'unroll_step'" in message, message
  for option in ("sample_batching", "unroll_steps", "remat", "backtracking", "draw_outputs"):
    assert option in message, message
