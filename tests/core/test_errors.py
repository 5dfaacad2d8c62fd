import jax.numpy as jnp
import pytest

import vampire_jax as vj
from tests.helpers import _classifier_predictive
from vampire_jax._src.core.errors import InputError


def _one_line(raised) -> str:
  message = str(raised.value)
  assert len(message.splitlines()) == 1, message
  assert "ArrayImpl" not in message, message
  return message


@pytest.mark.parametrize(
  "call, names",
  [
    (lambda d, a: vj.gaussian_from_distrax({"w": a}), "tree must be a tree of distrax.Normal"),
    (lambda d, a: vj.to_distrax(a), "vj.to_distrax: dist must be a vj.Gaussian"),
    (lambda d, a: vj.predictive_interval(a), "vj.predictive_interval: distribution must be"),
    (lambda d, a: vj.uncertainty(d), "vj.uncertainty: draws must be per-draw class"),
    (lambda d, a: vj.regression_uncertainty(d, 0.3), "vj.regression_uncertainty: draws must"),
  ],
)
def test_refusals_name_what_they_got_not_arrayimpl(classifier, call, names):
  """Each refusal names the argument and what it got as a dtype and shape (float32[2]) or as
  a distribution, never `ArrayImpl`."""
  dist, _, _ = _classifier_predictive(classifier)
  with pytest.raises(InputError, match=names) as raised:
    call(dist, jnp.zeros(2))
  message = _one_line(raised)
  assert "float32[2]" in message or "a distribution (vampire_jax PredictiveCategorical" in message
