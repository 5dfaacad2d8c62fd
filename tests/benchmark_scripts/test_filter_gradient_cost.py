"""`benchmarks.filter_gradient_cost`: each variant computes the library's filter gradient (to the
second order), and a variant that fails makes the benchmark fail."""

import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import filter_gradient_cost
from vampire_jax._src.core import convolution


def test_the_concatenated_filter_gradient_is_the_librarys_to_second_order():
  """`benchmarks.filter_gradient_cost`'s "concatenated" variant times the same gradient."""

  x = jax.random.normal(jax.random.key(0), (3, 9, 9, 4))
  kernel = jax.random.normal(jax.random.key(1), (3, 3, 4, 6))
  padding = convolution.same_padding(9, 9, (3, 3), 2)
  grad = jax.random.normal(jax.random.key(2), (3, 5, 5, 6))
  _, library = convolution._backward(2, padding, (x, kernel), grad)
  ours = filter_gradient_cost.concatenated_filter_gradient(2, padding, x, kernel, grad)
  np.testing.assert_allclose(ours, library, rtol=1e-5, atol=1e-5)

  def second_order(filter_gradient):
    return jax.grad(lambda x: jnp.sum(jnp.sin(filter_gradient(2, padding, x, kernel, grad))))(x)

  def library_filter_gradient(stride, padding, x, kernel, grad):
    return convolution._backward(stride, padding, (x, kernel), grad)[1]

  np.testing.assert_allclose(
    second_order(filter_gradient_cost.concatenated_filter_gradient),
    second_order(library_filter_gradient),
    rtol=1e-4,
    atol=1e-4,
  )
  with pytest.raises(SystemExit):
    filter_gradient_cost.main(["--variants", "default,fastest"])


def test_the_stacked_variant_is_the_librarys_filter_gradient_to_second_order():
  """`filter_gradient_cost`'s "stacked" (the library's filter gradient before `e6a3b7a`)
  computes what the library computes, value and gradient."""

  x = jax.random.normal(jax.random.key(0), (3, 9, 9, 4))
  grad = jax.random.normal(jax.random.key(2), (3, 5, 5, 6))
  padding = convolution.same_padding(9, 9, (3, 3), 2)
  stacked = filter_gradient_cost.stacked_filter_gradient()

  def readout(filter_gradient):
    return lambda x, grad: jnp.sum(jnp.sin(filter_gradient(x, grad, (3, 3, 4, 6), 2, padding)))

  for ours, theirs in zip(
    (stacked(x, grad, (3, 3, 4, 6), 2, padding),)
    + jax.grad(readout(stacked), argnums=(0, 1))(x, grad),
    (convolution.filter_gradient(x, grad, (3, 3, 4, 6), 2, padding),)
    + jax.grad(readout(convolution.filter_gradient), argnums=(0, 1))(x, grad),
  ):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_the_autodiff_variant_is_the_librarys_rules_to_second_order():
  """`filter_gradient_cost`'s "autodiff" (the gradients' functions differentiated by autodiff,
  the library before its rules) computes what the rules compute, to the second order."""

  x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  kernel = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
  padding = convolution.same_padding(8, 8, (3, 3), 2)
  grad = jax.random.normal(jax.random.key(2), (2, 4, 4, 4))

  def second_order(filter_gradient, input_gradient):
    def readout(x, kernel, grad):
      d_kernel = filter_gradient(x, grad, kernel.shape, 2, padding)
      d_x = input_gradient(kernel, grad, x.shape, 2, padding)
      return jnp.sum(jnp.sin(d_kernel)) + jnp.sum(jnp.cos(d_x))

    return jax.grad(readout, argnums=(0, 1, 2))(x, kernel, grad)

  rules = second_order(convolution.filter_gradient, convolution.input_gradient)
  autodiff = second_order(convolution.filter_gradient.fun, convolution.input_gradient.fun)
  for ours, theirs in zip(rules, autodiff):
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_filter_gradient_cost_fails_when_a_variant_fails(monkeypatch, capsys):
  """A variant whose child process fails makes the benchmark exit non-zero, naming it."""

  def failing_child(command, **kwargs):
    return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nRuntimeError: boom")

  monkeypatch.setattr(subprocess, "run", failing_child)
  with pytest.raises(SystemExit) as exited:
    filter_gradient_cost.main(["--variants", "default,zero"])
  assert exited.value.code not in (0, None)
  message = str(exited.value.code) + capsys.readouterr().err
  assert "default" in message and "zero" in message and "failed" in message, message
