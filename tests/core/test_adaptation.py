"""adapt / maml_adapt / predict: reductions, closed forms, meta-gradients, invariances."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from tests.helpers import _small_regression
from vampire_jax._src.core.errors import InputError


def _tiny_mlp(dtype=jnp.float32):
  model = vj.MLP((8,), 1)
  params = jax.tree_util.tree_map(
    lambda p: p.astype(dtype), vj.init_params(model, jax.random.key(0), (1, 1))
  )
  apply_fn = vj.pure_apply(model)
  return params, apply_fn, vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.5))


def _sine_task(key, n=10, dtype=jnp.float32):
  kx, kq = jax.random.split(key)
  x = jax.random.uniform(kx, (n, 1), dtype, -3, 3)
  xq = jax.random.uniform(kq, (n, 1), dtype, -3, 3)
  return x, jnp.sin(x), xq, jnp.sin(xq)


def _meta_loss(prior_mean, prior_log_std, task, *, first_order, loss_fn, apply_fn):
  x, y, xq, yq = task
  prior = vj.Gaussian(prior_mean, prior_log_std)
  post = vj.adapt(
    prior,
    x,
    y,
    jax.random.key(7),
    loss_fn=loss_fn,
    num_steps=3,
    inner_lr=0.05,
    num_mc_samples=2,
    kl_weight=0.5,
    first_order=first_order,
  )
  logits = vj.predict(post, xq, jax.random.key(8), apply_fn=apply_fn, num_mc_samples=2)
  return jnp.mean((logits - yq[None]) ** 2)


def _quadratic(curvature: float):
  """loss(w) = curvature / 2 * |w|^2: gradient steps of size a scale w by 1 - a * curvature."""
  return lambda params, x, y: 0.5 * curvature * jnp.sum(jnp.square(params["w"]))


_GUARD_ON_TWO_DEVICES = """
import jax, jax.numpy as jnp, numpy as np, vampire_jax as vj
from vampire_jax.data import sine_line
assert len(jax.devices()) == 2
model = vj.MLP((8,), 1)
params = vj.init_params(model, jax.random.key(0), (1, 1))
apply_fn, nll = vj.pure_apply(model), vj.gaussian_nll(0.3)
tasks = sine_line.tasks_from_keys(jax.random.split(jax.random.key(1), 4))
keys = jax.random.split(jax.random.key(2), 4)
for learner in (vj.maml(apply_fn, nll, inner_lr=0.05, backtracking=True),
                vj.vampire(apply_fn, nll, inner_lr=0.05, backtracking=True, num_mc_query=2)):
  meta_params = learner.init(params, jax.random.key(3))
  one = vj.make_regression_evaluator(learner, 0.3)(meta_params, tasks, keys)
  two = vj.make_regression_evaluator(learner, 0.3, mesh=vj.task_mesh())(meta_params, tasks, keys)
  np.testing.assert_allclose(two.mse, one.mse, rtol=1e-5)
print("ok")
"""


def _adapt(prior, task, loss_fn, **settings):
  """`vj.adapt` on `task`'s support set with key 2."""
  return vj.adapt(
    prior, task.support_x, task.support_y, jax.random.key(2), loss_fn=loss_fn, **settings
  )


class AdaptationMathsTest(chex.TestCase):
  """Reductions and closed forms of the inner loop, with and without `jax.jit` (chex.variants)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_vampire_with_tiny_std_and_no_kl_is_maml(self):
    params, _, loss_fn = _tiny_mlp()
    x, y, _, _ = _sine_task(jax.random.key(1))
    for num_steps in (1, 2, 5):
      adapt = self.variant(
        functools.partial(
          vj.adapt, loss_fn=loss_fn, num_steps=num_steps, inner_lr=0.05, kl_weight=0.0
        )
      )
      posterior = adapt(vj.point_mass(params), x, y, jax.random.key(2))
      maml = self.variant(
        functools.partial(vj.maml_adapt, loss_fn=loss_fn, num_steps=num_steps, inner_lr=0.05)
      )(params, x, y)
      chex.assert_trees_all_close(posterior.mean, maml, atol=1e-6, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_maml_adapt_is_plain_gradient_descent_step_by_step(self):
    params, _, loss_fn = _tiny_mlp()
    x, y, _, _ = _sine_task(jax.random.key(1))
    expected = params
    for _ in range(3):
      grads = jax.grad(loss_fn)(expected, x, y)
      expected = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, expected, grads)
    adapt = self.variant(
      functools.partial(vj.maml_adapt, loss_fn=loss_fn, num_steps=3, inner_lr=0.1)
    )
    chex.assert_trees_all_close(adapt(params, x, y), expected, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_adapt_matches_closed_form_on_a_quadratic(self):
    # loss(w) = 0.5 (w - c)^2. With many draws E_q[loss] = 0.5((m - c)^2 + s^2),
    # so one step moves m by -lr (m - c) and log s by -lr s^2 (KL is 0 at q = p).
    c, m, log_s, lr = 2.0, 0.5, np.log(0.3), 0.1
    prior = vj.Gaussian({"w": jnp.array(m)}, {"w": jnp.array(log_s)})
    loss_fn = lambda p, x, y: 0.5 * (p["w"] - c) ** 2  # noqa: E731

    def adapt(num_steps):
      settings = dict(loss_fn=loss_fn, inner_lr=lr, num_mc_samples=100_000, kl_weight=1.0)
      run = self.variant(functools.partial(vj.adapt, num_steps=num_steps, **settings))
      return run(prior, jnp.zeros((1, 1)), jnp.zeros((1, 1)), jax.random.key(0))

    post = adapt(1)
    np.testing.assert_allclose(post.mean["w"], m - lr * (m - c), atol=2e-3)
    np.testing.assert_allclose(post.log_std["w"], log_s - lr * 0.3**2, atol=1e-3)

    # Second step: KL(q || p) now pulls back; its gradient is known in closed form.
    post2 = adapt(2)
    m1, s1 = float(post.mean["w"]), float(np.exp(post.log_std["w"]))
    s0 = 0.3
    grad_m = (m1 - c) + (m1 - m) / s0**2
    grad_log_s = s1**2 + (s1**2 / s0**2 - 1.0)
    np.testing.assert_allclose(post2.mean["w"], m1 - lr * grad_m, atol=5e-3)
    np.testing.assert_allclose(post2.log_std["w"], np.log(s1) - lr * grad_log_s, atol=2e-3)


def test_zero_steps_returns_the_prior():
  params, _, loss_fn = _tiny_mlp()
  prior = vj.gaussian_from_params(params, jax.random.key(0))
  x, y, _, _ = _sine_task(jax.random.key(1))
  chex.assert_trees_all_equal(
    vj.adapt(prior, x, y, jax.random.key(0), loss_fn=loss_fn, num_steps=0, inner_lr=0.1), prior
  )


def test_second_order_meta_gradient_matches_finite_differences():
  with jax.enable_x64(True):
    params, apply_fn, loss_fn = _tiny_mlp(jnp.float64)
    prior = vj.gaussian_from_params(params, jax.random.key(3), (-2.0, -1.0))
    task = _sine_task(jax.random.key(4), dtype=jnp.float64)
    f = lambda m, s: _meta_loss(m, s, task, first_order=False, loss_fn=loss_fn, apply_fn=apply_fn)  # noqa: E731
    jax.test_util.check_grads(
      f, (prior.mean, prior.log_std), order=1, modes=["rev"], eps=1e-5, atol=1e-5, rtol=1e-4
    )


def test_first_order_meta_gradient_is_the_query_gradient_at_the_posterior():
  with jax.enable_x64(True):
    params, apply_fn, loss_fn = _tiny_mlp(jnp.float64)
    prior = vj.gaussian_from_params(params, jax.random.key(3), (-2.0, -1.0))
    task = _sine_task(jax.random.key(4), dtype=jnp.float64)
    kw = dict(loss_fn=loss_fn, apply_fn=apply_fn)
    first = jax.grad(lambda m, s: _meta_loss(m, s, task, first_order=True, **kw), (0, 1))(
      prior.mean, prior.log_std
    )
    second = jax.grad(lambda m, s: _meta_loss(m, s, task, first_order=False, **kw), (0, 1))(
      prior.mean, prior.log_std
    )
    # First order: d posterior / d prior = I, so the meta-gradient is the
    # query loss's gradient w.r.t. the posterior's (mean, log_std).
    x, y, xq, yq = task
    post = vj.adapt(
      prior,
      x,
      y,
      jax.random.key(7),
      loss_fn=loss_fn,
      num_steps=3,
      inner_lr=0.05,
      num_mc_samples=2,
      kl_weight=0.5,
    )

    def query_loss(m, s):
      out = vj.predict(
        vj.Gaussian(m, s), xq, jax.random.key(8), apply_fn=apply_fn, num_mc_samples=2
      )
      return jnp.mean((out - yq[None]) ** 2)

    chex.assert_trees_all_close(
      first, jax.grad(query_loss, (0, 1))(post.mean, post.log_std), atol=1e-10
    )
    diff = max(
      float(jnp.max(jnp.abs(a - b)))
      for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second))
    )
    assert diff > 1e-4, "second-order terms should change the meta-gradient"


def test_maml_second_order_gradient_matches_finite_differences_and_first_order_differs():
  with jax.enable_x64(True):
    params, apply_fn, loss_fn = _tiny_mlp(jnp.float64)
    x, y, xq, yq = _sine_task(jax.random.key(4), dtype=jnp.float64)

    def meta_loss(p, first_order):
      adapted = vj.maml_adapt(
        p, x, y, loss_fn=loss_fn, num_steps=2, inner_lr=0.1, first_order=first_order
      )
      return loss_fn(adapted, xq, yq)

    jax.test_util.check_grads(
      lambda p: meta_loss(p, False), (params,), order=1, modes=["rev"], eps=1e-5
    )
    fo = jax.grad(lambda p: meta_loss(p, True))(params)
    adapted = vj.maml_adapt(params, x, y, loss_fn=loss_fn, num_steps=2, inner_lr=0.1)
    chex.assert_trees_all_close(fo, jax.grad(loss_fn)(adapted, xq, yq), atol=1e-10)


class AdaptVariantsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_no_jit_agree_and_same_key_same_result(self):
    params, _, loss_fn = _tiny_mlp()
    prior = vj.gaussian_from_params(params, jax.random.key(0))
    x, y, _, _ = _sine_task(jax.random.key(1))

    @self.variant
    def run(prior, x, y, key):
      return vj.adapt(
        prior, x, y, key, loss_fn=loss_fn, num_steps=3, inner_lr=0.1, num_mc_samples=3
      )

    a = run(prior, x, y, jax.random.key(5))
    reference = vj.adapt(
      prior, x, y, jax.random.key(5), loss_fn=loss_fn, num_steps=3, inner_lr=0.1, num_mc_samples=3
    )
    chex.assert_trees_all_close(a, reference, atol=1e-6)
    chex.assert_trees_all_equal(a, run(prior, x, y, jax.random.key(5)))
    b = run(prior, x, y, jax.random.key(6))
    assert not np.allclose(a.log_std["Dense_0"]["kernel"], b.log_std["Dense_0"]["kernel"])


def test_vmap_over_tasks_equals_a_loop():
  params, apply_fn, loss_fn = _tiny_mlp()
  prior = vj.gaussian_from_params(params, jax.random.key(0))
  tasks = [_sine_task(jax.random.key(i)) for i in range(4)]
  xs = jnp.stack([t[0] for t in tasks])
  ys = jnp.stack([t[1] for t in tasks])  # noqa: E702
  keys = jax.random.split(jax.random.key(9), 4)

  def one(x, y, key):
    return vj.adapt(prior, x, y, key, loss_fn=loss_fn, num_steps=3, inner_lr=0.1, num_mc_samples=2)

  batched = jax.vmap(one)(xs, ys, keys)
  for i in range(4):
    chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda a: a[i], batched), one(xs[i], ys[i], keys[i]), atol=1e-5
    )


def test_predict_stacks_samples_and_averages_to_the_mean_for_a_linear_model():
  dist = vj.Gaussian({"w": jnp.array([[2.0]])}, {"w": jnp.array([[np.log(0.5)]])})
  apply_fn = lambda p, x: x @ p["w"]  # noqa: E731
  x = jnp.array([[1.0], [3.0]])
  out = vj.predict(dist, x, jax.random.key(0), apply_fn=apply_fn, num_mc_samples=50_000)
  chex.assert_shape(out, (50_000, 2, 1))
  np.testing.assert_allclose(jnp.mean(out, 0)[:, 0], [2.0, 6.0], rtol=0.01)
  np.testing.assert_allclose(jnp.std(out, 0)[:, 0], [0.5, 1.5], rtol=0.02)


def test_bad_inputs_get_clear_errors():
  params, apply_fn, loss_fn = _tiny_mlp()
  prior = vj.gaussian_from_params(params, jax.random.key(0))
  x, y, _, _ = _sine_task(jax.random.key(1))
  key = jax.random.key(0)
  with pytest.raises(ValueError, match=r"adapt: support_y must be \[10, ...\]"):
    vj.adapt(prior, x, y[:3], key, loss_fn=loss_fn, num_steps=1, inner_lr=0.1)
  with pytest.raises(ValueError, match="num_steps"):
    vj.adapt(prior, x, y, key, loss_fn=loss_fn, num_steps=-1, inner_lr=0.1)
  with pytest.raises(ValueError, match="num_mc_samples"):
    vj.adapt(prior, x, y, key, loss_fn=loss_fn, num_steps=1, inner_lr=0.1, num_mc_samples=0)
  with pytest.raises(ValueError, match="same tree structure"):
    vj.adapt(
      vj.Gaussian(prior.mean, {"other": jnp.zeros(1)}),
      x,
      y,
      key,
      loss_fn=loss_fn,
      num_steps=1,
      inner_lr=0.1,
    )
  with pytest.raises(ValueError, match="num_steps"):
    vj.maml_adapt(params, x, y, loss_fn=loss_fn, num_steps=-2, inner_lr=0.1)
  with pytest.raises(ValueError, match="num_mc_samples"):
    vj.predict(prior, x, key, apply_fn=apply_fn, num_mc_samples=0)
  with pytest.raises(TypeError, match="Gaussian"):
    vj.adapt((prior.mean, prior.log_std), x, y, key, loss_fn=loss_fn, num_steps=1, inner_lr=0.1)


def test_second_order_steps_interpolates_between_first_and_full_second_order():
  # MAML, 3 inner steps: k = 3 is full second order, k = 0 is first order; the
  # authors' k = 1 differs from both. By hand for k = 1 and one more step: the
  # second step's gradient is a constant, so d theta_2 / d theta = d theta_1 / d theta.
  with jax.enable_x64(True):
    params, _, loss_fn = _tiny_mlp(jnp.float64)
    x, y, xq, yq = _sine_task(jax.random.key(4), dtype=jnp.float64)

    def meta_gradient(num_steps, **kw):
      return jax.grad(
        lambda p: loss_fn(
          vj.maml_adapt(p, x, y, loss_fn=loss_fn, num_steps=num_steps, inner_lr=0.1, **kw), xq, yq
        )
      )(params)

    full, first = meta_gradient(3), meta_gradient(3, first_order=True)
    chex.assert_trees_all_close(meta_gradient(3, second_order_steps=3), full, atol=1e-12)
    chex.assert_trees_all_close(meta_gradient(3, second_order_steps=0), first, atol=1e-12)
    authors = meta_gradient(3, second_order_steps=1)
    flat = lambda t: jnp.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(t)])  # noqa: E731
    assert float(jnp.max(jnp.abs(flat(authors) - flat(full)))) > 1e-6
    assert float(jnp.max(jnp.abs(flat(authors) - flat(first)))) > 1e-6
    # Two steps, k = 1: J = d theta_1 / d theta, and the gradient is J^T grad L(theta_2).
    theta_1 = vj.maml_adapt(params, x, y, loss_fn=loss_fn, num_steps=1, inner_lr=0.1)
    theta_2 = vj.maml_adapt(theta_1, x, y, loss_fn=loss_fn, num_steps=1, inner_lr=0.1)
    _, pullback = jax.vjp(
      lambda p: vj.maml_adapt(p, x, y, loss_fn=loss_fn, num_steps=1, inner_lr=0.1), params
    )
    by_hand = pullback(jax.grad(loss_fn)(theta_2, xq, yq))[0]
    chex.assert_trees_all_close(meta_gradient(2, second_order_steps=1), by_hand, atol=1e-10)


def test_vampire_second_order_steps_keeps_the_kl_gradient():
  # With the KL term off, k = 0 is first order; with it on, k = 0 still
  # differentiates the KL's pull towards the prior, so it is not.
  with jax.enable_x64(True):
    params, apply_fn, loss_fn = _tiny_mlp(jnp.float64)
    prior = vj.gaussian_from_params(params, jax.random.key(3), (-2.0, -1.0))
    x, y, xq, yq = _sine_task(jax.random.key(4), dtype=jnp.float64)

    def meta_gradient(kl_weight, **kw):
      def loss(dist):
        post = vj.adapt(
          dist,
          x,
          y,
          jax.random.key(7),
          loss_fn=loss_fn,
          num_steps=3,
          inner_lr=0.05,
          kl_weight=kl_weight,
          **kw,
        )
        return loss_fn(post.mean, xq, yq)

      return jax.grad(loss)(prior)

    chex.assert_trees_all_close(
      meta_gradient(0.0, second_order_steps=0), meta_gradient(0.0, first_order=True), atol=1e-12
    )
    with_kl = meta_gradient(0.5, second_order_steps=0)
    flat = lambda t: jnp.concatenate([v.ravel() for v in jax.tree_util.tree_leaves(t)])  # noqa: E731
    assert (
      float(jnp.max(jnp.abs(flat(with_kl) - flat(meta_gradient(0.5, first_order=True))))) > 1e-6
    )
    chex.assert_trees_all_close(
      meta_gradient(0.5, second_order_steps=3), meta_gradient(0.5), atol=1e-10
    )
    with pytest.raises(ValueError, match="second_order_steps"):
      vj.adapt(
        prior,
        x,
        y,
        jax.random.key(0),
        loss_fn=loss_fn,
        num_steps=1,
        inner_lr=0.1,
        second_order_steps=-1,
      )


def test_backtracking_refuses_a_rising_step_and_halves_the_later_ones_in_closed_form():
  """a * curvature = 3: each plain step scales w by -2 (the loss 4x); with the guard the first
  step is refused, and the next four, halved (factor 1 - 1.5 = -0.5), are taken."""
  loss_fn = _quadratic(30.0)
  params, x, y = {"w": jnp.array([1.0, -2.0])}, jnp.zeros((1, 1)), jnp.zeros((1, 1))
  plain = vj.maml_adapt(params, x, y, loss_fn=loss_fn, num_steps=5, inner_lr=0.1)
  np.testing.assert_allclose(plain["w"], params["w"] * (-2.0) ** 5)  # ran away: 1024x the loss
  guarded = vj.maml_adapt(
    params, x, y, loss_fn=loss_fn, num_steps=5, inner_lr=0.1, backtracking=True
  )
  np.testing.assert_allclose(guarded["w"], params["w"] * (-0.5) ** 4, rtol=1e-6)
  # a * curvature = 5: refused at 1 and 1/2 (factors -4, -1.5), taken at 1/4 (-0.25).
  five = vj.maml_adapt(
    params, x, y, loss_fn=_quadratic(50.0), num_steps=5, inner_lr=0.1, backtracking=True
  )
  np.testing.assert_allclose(five["w"], params["w"] * (-0.25) ** 3, rtol=1e-6)


def test_backtracking_changes_nothing_where_every_step_lowers_the_loss():
  params, _, loss_fn = _tiny_mlp()
  x, y, xq, yq = _sine_task(jax.random.key(1))
  settings = dict(loss_fn=loss_fn, num_steps=5, inner_lr=0.05)
  plain = vj.maml_adapt(params, x, y, **settings)
  chex.assert_trees_all_close(vj.maml_adapt(params, x, y, backtracking=True, **settings), plain)
  prior = vj.gaussian_from_params(params, jax.random.key(2))
  vampire = dict(settings, inner_lr=0.01, num_mc_samples=4, kl_weight=0.02)  # KL factor <= 0.6
  chex.assert_trees_all_close(
    vj.adapt(prior, x, y, jax.random.key(3), backtracking=True, **vampire),
    vj.adapt(prior, x, y, jax.random.key(3), **vampire),
  )

  # ... and its meta-gradient is the plain loop's (the decisions are constants).
  def query_loss(params, backtracking):
    adapted = vj.maml_adapt(params, x, y, backtracking=backtracking, **settings)
    return loss_fn(adapted, xq, yq)

  chex.assert_trees_all_close(
    jax.grad(query_loss)(params, True), jax.grad(query_loss)(params, False), rtol=1e-6
  )


def test_backtracking_keeps_a_too_curved_task_from_running_away():
  """The regression MLP at ten times a stable step: the plain loop's support loss explodes;
  with the guard it ends no higher than it started, for MAML and for VAMPIRE."""
  model = vj.MLP((40, 40), 1)
  params = vj.init_params(model, jax.random.key(0), (1, 1))
  loss_fn = vj.loss_from_apply(vj.pure_apply(model), vj.gaussian_nll(0.3))
  x = jnp.linspace(4.2, 5.0, 5)[:, None]  # a support clustered near x = 5
  y = 3.0 * x - 2.0
  settings = dict(loss_fn=loss_fn, num_steps=5, inner_lr=0.02)
  before = float(loss_fn(params, x, y))
  plain = float(loss_fn(vj.maml_adapt(params, x, y, **settings), x, y))
  guarded = float(loss_fn(vj.maml_adapt(params, x, y, backtracking=True, **settings), x, y))
  assert not plain < 100 * before  # non-finite or far above
  assert guarded <= before
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  vampire = dict(settings, num_mc_samples=4, kl_weight=0.02)
  posterior = vj.adapt(prior, x, y, jax.random.key(2), backtracking=True, **vampire)
  support = dict(loss_fn=loss_fn, num_mc_samples=64)
  assert float(vj.expected_nll(posterior, x, y, jax.random.key(3), **support)) <= float(
    vj.expected_nll(prior, x, y, jax.random.key(3), **support)
  )


def test_backtracking_runs_with_tasks_split_over_devices():
  """The backtracking guard runs when the evaluator splits tasks over two devices: under
  `shard_map` a loop's carry must vary over the devices in and out, and the guard's step
  scale (a constant 1.0 going in) does."""
  import subprocess
  import sys

  from tests.conftest import user_env

  done = subprocess.run(
    [sys.executable, "-c", _GUARD_ON_TWO_DEVICES],
    env=user_env(JAX_NUM_CPU_DEVICES="2"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_params_give_a_posterior_whose_log_stds_move(dtype):
  """From bfloat16/float16 params the prior is float32, and 5 inner steps move its log-stds
  by more than 1e-4 (float32 moves them by 0.0013)."""
  apply_fn, params, task = _small_regression()
  low = jax.tree_util.tree_map(lambda p: p.astype(dtype), params)
  prior = vj.gaussian_from_params(low, jax.random.key(1))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(prior))
  loss_fn = vj.loss_from_apply(vj.mixed_precision(apply_fn, dtype), vj.gaussian_nll(0.3))
  posterior = _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.01)
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(
      jax.tree_util.tree_leaves(posterior.log_std), jax.tree_util.tree_leaves(prior.log_std)
    )
  )
  assert moved > 1e-4


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_low_precision_distribution_is_refused_by_adapt_naming_the_leaf(dtype):
  apply_fn, params, task = _small_regression()
  prior = vj.gaussian_from_params(params, jax.random.key(1))
  low = jax.tree_util.tree_map(lambda p: p.astype(dtype), prior)
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  with pytest.raises(InputError, match=r"adapt: mean\['Dense_0'\]\['bias'\] is (bfloat16|float16)"):
    _adapt(low, task, loss_fn, num_steps=1, inner_lr=1e-3)


@pytest.mark.parametrize("narrow", ["point_mass", "log_std_-100"])
def test_adapt_from_a_very_narrow_prior_refuses_instead_of_returning_nan(narrow):
  """From a point mass or log-stds of -100, adapt refuses a non-finite posterior naming the KL
  term's step factor; with kl_weight 0 a point mass adapts as MAML, finite."""
  apply_fn, params, task = _small_regression()
  prior = (
    vj.point_mass(params)
    if narrow == "point_mass"
    else vj.Gaussian(params, jax.tree_util.tree_map(lambda p: jnp.full_like(p, -100.0), params))
  )
  loss_fn = vj.loss_from_apply(apply_fn, vj.gaussian_nll(0.3))
  with pytest.raises(
    InputError,
    match="adapt: the posterior is not finite after 5 steps from "
    "a finite prior; the KL term's step factor",
  ):
    _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.1)
  # With kl_weight 0 a point mass is MAML: finite, nothing refused.
  posterior = _adapt(prior, task, loss_fn, num_steps=5, inner_lr=1e-3, kl_weight=0.0)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(posterior))
