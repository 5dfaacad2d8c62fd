"""Phi, the standard normal CDF, in NumPy float64 to about 1e-15 (numpy has no erf).

The calibration metrics evaluate a Gaussian mixture's CDF on the host, for
every query point and draw; scipy is not a dependency, and JAX's `ndtr` would
move the arrays to a device and back.
"""

import math

import numpy as np
from numpy.typing import ArrayLike

# Cephes ndtr.c (S. L. Moshier) rational approximations to erf and erfc,
# accurate to about 1e-15; numpy has no erf and scipy is optional.
_ERF_T = (
  9.60497373987051638749e0,
  9.00260197203842689217e1,
  2.23200534594684319226e3,
  7.00332514112805075473e3,
  5.55923013010394962768e4,
)
_ERF_U = (
  3.35617141647503099647e1,
  5.21357949780152679795e2,
  4.59432382970980127987e3,
  2.26290000613890934246e4,
  4.92673942608635921086e4,
)
_ERFC_P = (
  2.46196981473530512524e-10,
  5.64189564831068821977e-1,
  7.46321056442269912687e0,
  4.86371970985681366614e1,
  1.96520832956077098242e2,
  5.26445194995477358631e2,
  9.34528527171957607540e2,
  1.02755188689515710272e3,
  5.57535335369399327526e2,
)
_ERFC_Q = (
  1.32281951154744992508e1,
  8.67072140885989742329e1,
  3.54937778887819891062e2,
  9.75708501743205489753e2,
  1.82390916687909736289e3,
  2.24633760818710981792e3,
  1.65666309194161350182e3,
  5.57535340817727675546e2,
)
_ERFC_R = (
  5.64189583547755073984e-1,
  1.27536670759978104416e0,
  5.01905042251180477414e0,
  6.16021097993053585195e0,
  7.40974269950448939160e0,
  2.97886665372100240670e0,
)
_ERFC_S = (
  2.26052863220117276590e0,
  9.39603524938001434673e0,
  1.20489539808096656605e1,
  1.70814450747565897222e1,
  9.60896809063285878198e0,
  3.36907645100081516050e0,
)


def _polevl(x, coefficients, leading_one=False):
  """Polynomial with coefficients from the highest degree down (Horner)."""
  result = np.ones_like(x) if leading_one else np.zeros_like(x)
  for c in coefficients:
    result = result * x + c
  return result


def _erf_small(x):
  """erf(x) for |x| <= 1."""
  z = x * x
  return x * _polevl(z, _ERF_T) / _polevl(z, _ERF_U, leading_one=True)


def _erfc_large(x):
  """erfc(x) for x >= 1."""
  ratio = _polevl(x, _ERFC_P) / _polevl(x, _ERFC_Q, leading_one=True)
  far = x >= 8.0
  if np.any(far):  # rare: |y - mean| > 11 noise_std
    ratio = np.where(far, _polevl(x, _ERFC_R) / _polevl(x, _ERFC_S, leading_one=True), ratio)
  return np.exp(-x * x) * ratio


def normal_cdf(x: ArrayLike) -> np.ndarray:
  """Phi(x), the standard normal CDF, elementwise (as Cephes `ndtr`)."""
  t = np.asarray(x, dtype=np.float64) * math.sqrt(0.5)
  z = np.abs(t)
  # Phi(x) = (1 + erf(t)) / 2 with t = x / sqrt(2) near 0; in the tails
  # erfc keeps relative accuracy: Phi(x) = erfc(|t|) / 2 for x < 0.
  centre = 0.5 + 0.5 * _erf_small(np.clip(t, -1.0, 1.0))
  tail = 0.5 * _erfc_large(np.clip(z, 1.0, 40.0))
  return np.where(z < 1.0, centre, np.where(t > 0, 1.0 - tail, tail))
