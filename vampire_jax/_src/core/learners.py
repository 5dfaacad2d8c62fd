"""Meta-learners as NamedTuples of pure functions: VAMPIRE and MAML.

A `MetaLearner` says how to turn meta-parameters into task parameters
(`adapt`) and task parameters into predictions (`predict`). `vampire` and
`maml` build one (the baselines in `vampire_jax.baselines` too);
`meta_step.make_meta_step` and the evaluators work with any. Vampire2, the
authors' 2021 VAMPIRE, is `vampire` with two settings: the inner loop's KL
taken to N(0, I) (`kl_target="standard_normal"`) and the adapted posterior's
KL to it added to the meta-loss (`outer_kl_weight`).

Defaults are stable: VAMPIRE's inner_lr 0.01 and kl_weight 0.02 give
inner_lr * kl_weight / sigma_p^2 <= 0.6 at the initial prior (log-std in
[-4, -3]), below the limit of 2 where the KL term makes the inner loop
oscillate (`gaussian.kl_step_factor`). kl_weight 0.02 is the paper's
beta = 0.1 on the summed NLL of a 5-example support set, expressed against
the mean NLL this library uses.
"""

import contextlib
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from vampire_jax._src.core import adaptation, batching, losses
from vampire_jax._src.core import input_checks as checks
from vampire_jax._src.core.errors import InputError
from vampire_jax._src.core.gaussian import (
  Gaussian,
  gaussian_from_params,
  kl_divergence,
  sample,
  standard_normal_like,
)
from vampire_jax._src.core.tasks import Task

PyTree = Any

# VAMPIRE's stable defaults (see the module docstring).
DEFAULT_INNER_LR = 0.01
DEFAULT_KL_WEIGHT = 0.02
# What the KL term of VAMPIRE's inner loop measures the posterior against: the
# meta-learned prior (the paper, Alg. 1) or N(0, I) (the authors' 2021 Vampire2.py).
KL_TARGETS = ("prior", "standard_normal")


def default_inner_lr(nll: losses.Likelihood, algorithm_default: float) -> float:
  """The inner learning rate a factory uses when given none.

  The algorithm's own default, lowered to the likelihood's
  `default_inner_lr` where it has one: a Gaussian likelihood's curvature
  grows as 1 / noise_std^2, and at the categorical defaults the inner loop of
  a regression network with noise_std 0.3 goes non-finite at initialisation
  (docs/fidelity.md, "Defaults that hold").
  """
  return min(algorithm_default, getattr(nll, "default_inner_lr", algorithm_default))


def check_settings(
  where: str,
  inner_lr: Optional[float],
  kl_weight: Optional[float] = None,
  **counts: int,
) -> None:
  """A factory's step sizes and counts, checked when the learner is built (one line each).

  `inner_lr` finite and > 0 (None: the default), `kl_weight` finite and
  >= 0, each of `counts` (name=(value, lowest)) an integer >= its lowest.
  """
  if inner_lr is not None:
    checks.rate(where, "inner_lr", inner_lr, positive=True)
  if kl_weight is not None:
    checks.rate(where, "kl_weight", kl_weight, positive=False)
  for name, (value, lowest) in counts.items():
    checks.step_count(where, name, value, lowest)


class MetaLearner(NamedTuple):
  """A gradient-based meta-learning algorithm.

  Attributes:
    init: `init(params, key) -> meta_params` from a network's initial weights.
    adapt: `adapt(meta_params, support_x, support_y, key) -> task_params`.
    predict: `predict(task_params, x, key) -> outputs [num_samples, batch, ...]`.
    nll: `nll(outputs_one_sample, y) -> scalar`, the likelihood trained on.
    meta_loss: optional `meta_loss(meta_params, task, key) -> (loss, query_outputs)`,
      one task's meta-training loss, for algorithms whose meta-objective is not
      "adapt on support, NLL on query" (e.g. PLATIPUS, ABML). `None` means
      `query_loss`'s default.
    settings: optional `InnerLoopSettings` (the loss and step sizes of the
      inner loop), read by `vj.check_inner_loop` to say which value to change.
    tasks_per_step: the tasks per meta-step that `meta_loss` counts (SImPa's
      hyper-prior term, M); None: it counts none. A step of another count is
      refused (`vj.make_train_step`, `vj.make_meta_step`).
  """

  init: Callable[[PyTree, jax.Array], PyTree]
  adapt: Callable[[PyTree, jax.Array, jax.Array, jax.Array], PyTree]
  predict: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
  nll: losses.Likelihood
  meta_loss: Optional[Callable[[PyTree, Task, jax.Array], tuple[jax.Array, jax.Array]]] = None
  settings: Optional["InnerLoopSettings"] = None
  tasks_per_step: Optional[int] = None


def check_meta_params_kind(
  where: str, name: str, learner: MetaLearner, meta_params: PyTree, fix: str
) -> None:
  """Refuses meta-parameters of another kind than `learner.init` makes (a vj.Gaussian for MAML,
  a weight tree for VAMPIRE), in one line naming both and `fix`.

  Meta-parameters of init's own container pass: an init that does not take its own output
  back (SImPa's generator and PHI network) makes another tree from them than they are.
  """
  expected = _structure_of_init(learner, getattr(meta_params, "mean", meta_params))
  made = jax.tree_util.tree_structure(meta_params)
  if expected is not None and expected != made and not _same_container(made, expected):
    raise InputError(
      f"{where}: {name} is a {_kind_of(made)}, but this learner's init makes a "
      f"{_kind_of(expected)} (a MAML learner takes weights, VAMPIRE a vj.Gaussian): {fix}"
    )


def _structure_of_init(learner: MetaLearner, weights: PyTree):
  """The tree structure `learner.init` makes from `weights` (traced only); None if it fails."""
  try:
    return jax.tree_util.tree_structure(jax.eval_shape(learner.init, weights, jax.random.key(0)))
  except Exception:  # an init that needs more than weights: nothing to compare with
    return None


def _container(structure):
  node = structure.node_data()
  return node[0] if node is not None else None


def _same_container(made, expected) -> bool:
  """Both trees are the same NamedTuple of meta-parameters (e.g. `SimpaParams`)."""
  kind = _container(made)
  return _is_named_tuple(kind) and kind is _container(expected)


def _is_named_tuple(kind) -> bool:
  return isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")


def _kind_of(structure) -> str:
  """How a message names meta-parameters of this structure: `vj.Gaussian`, another
  NamedTuple by its name (`SimpaParams`), or `weight tree`."""
  kind = _container(structure)
  if kind is Gaussian:
    return "vj.Gaussian"
  return kind.__name__ if _is_named_tuple(kind) else "weight tree"


def check_step_tasks(learner: MetaLearner, count: int, described: str) -> None:
  """Refuses a meta-step of `count` tasks for a learner whose meta-loss counts another.

  Args:
    learner: the learner the step trains.
    count: the tasks the step adapts to.
    described: where `count` comes from, e.g. "make_train_step: tasks_per_step=4".
  """
  built_for = getattr(learner, "tasks_per_step", None)
  if built_for is not None and built_for != count:
    raise InputError(
      f"{described}, but the learner was built for tasks_per_step={built_for} (its meta-loss "
      f"counts {built_for} tasks a step, as SImPa's hyper-prior term does); give both the same "
      f"T, e.g. vj.baselines.simpa(..., tasks_per_step={count})"
    )


class InnerLoopSettings(NamedTuple):
  """What a learner's inner loop does, for diagnostics (`vj.check_inner_loop`).

  Attributes:
    loss_fn: `loss_fn(weights, x, y)`, the support loss under one weight tree.
    inner_lr: the inner learning rate.
    kl_weight: the KL term's weight (0 for point estimates).
    num_inner_steps: the number of inner steps.
    kl_target: what the KL term measures the posterior against: 'prior'
      (its step factor is inner_lr * kl_weight / sigma_p^2) or
      'standard_normal' (sigma 1: the factor is inner_lr * kl_weight).
  """

  loss_fn: losses.LossFn
  inner_lr: float
  kl_weight: float
  num_inner_steps: int
  kl_target: str = "prior"


def vampire(
  apply_fn: losses.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  kl_weight: float = DEFAULT_KL_WEIGHT,
  num_mc_train: int = 1,
  num_mc_query: int = 1,
  first_order: bool = False,
  log_std_init: tuple[float, float] = (-4.0, -3.0),
  sample_batching: batching.Batching = "vmap",
  unroll_steps: bool = False,
  remat: bool = False,
  second_order_steps: Optional[int] = None,
  draw_outputs: Optional[adaptation.OutputSampler] = None,
  kl_target: str = "prior",
  outer_kl_weight: float = 0.0,
  backtracking: bool = False,
) -> MetaLearner:
  """VAMPIRE (Nguyen et al. 2020, Alg. 1): Gaussian prior, VI inner loop.

  Vampire2, the authors' VAMPIRE of 2021 (`Vampire2.py`), is this learner with
  `kl_target="standard_normal"`, `outer_kl_weight=kl_weight` and
  `first_order=True`, their `KL_weight` 1e-6 as `kl_weight`: the inner loop
  fits the task posterior q with a KL to N(0, I) instead of the prior, and
  each task's meta-loss is the query NLL (the mean over examples, averaged
  over the L_v draws) plus `outer_kl_weight * KL(q || N(0, I))`.

  Raises `InputError` naming the argument for a non-finite or negative
  `inner_lr` (or 0), `kl_weight` or `outer_kl_weight`, an unknown
  `kl_target`, counts that are not integers, and switches (`first_order`,
  `unroll_steps`, `remat`, `backtracking`) that are not True or False (the
  string "False" would be true).

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `losses.categorical_nll`.
    num_inner_steps: S, the gradient steps of adaptation.
    inner_lr: alpha; None: 0.01, or the likelihood's lower `default_inner_lr`
      (`default_inner_lr`). The paper's 0.1 with kl_weight 0.1 diverges at
      the initial prior (kl_step_factor 11-30); see the module docstring.
    kl_weight: beta, the KL weight in the VFE, against the mean NLL.
    num_mc_train: L_t, weight draws per inner step.
    num_mc_query: L_v, weight draws on the query set (and for prediction).
    first_order: stop gradients through the inner updates.
    log_std_init: range of the uniform initial prior log-stds.
    sample_batching: how Monte-Carlo forward passes are batched. With 'map'
      or 'remat_map' and `num_mc_query` > 1, the meta-loss takes each query
      draw's gradient as the draw runs (`batching.map_mean`): the same values,
      each draw's forward pass run once.
    unroll_steps: unroll the inner loop.
    remat: recompute each inner step in the backward pass instead of storing
      its activations (`jax.checkpoint`): less memory, more compute.
    second_order_steps: None (Alg. 1) differentiates every inner step at
      second order; 1 is the authors' code (see `adaptation.adapt`).
    draw_outputs: optional: draw outputs instead of weights, in the inner
      loop, on the query set and at prediction (the local reparameterisation
      trick, `vj.local_reparameterization` for a `vj.MLP`; off by default).
    kl_target: 'prior' (Alg. 1): the inner loop's KL is KL(q || prior);
      'standard_normal' (Vampire2): KL(q || N(0, I)).
    outer_kl_weight: the weight of KL(q || kl_target), the adapted
      posterior's, added to each task's meta-loss (0: none, Alg. 1).
    backtracking: not the paper's (off by default): an inner step that raises
      the support VFE, or makes it non-finite, is not taken and the steps after
      it are halved (`vj.adapt`): a guard for tasks too curved for `inner_lr`.

  Examples:
    >>> from vampire_jax.data import sine_line
    >>> model = vj.MLP((16,), 1)
    >>> learner = vj.vampire(vj.pure_apply(model), vj.gaussian_nll(0.3), num_mc_query=4)
    >>> meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)),
    ...                            jax.random.key(1))
    >>> task = sine_line.tasks_from_keys(jax.random.split(jax.random.key(2), 1))
    >>> task = jax.tree.map(lambda field: field[0], task)  # the one task
    >>> posterior = learner.adapt(meta_params, task.support_x, task.support_y, jax.random.key(3))
    >>> learner.predict(posterior, task.query_x, jax.random.key(4)).shape  # [draws, query, 1]
    (4, 10, 1)
  """
  checks.flags(
    "vampire",
    first_order=first_order,
    unroll_steps=unroll_steps,
    remat=remat,
    backtracking=backtracking,
  )
  check_settings(
    "vampire",
    inner_lr,
    kl_weight,
    num_inner_steps=(num_inner_steps, 0),
    num_mc_train=(num_mc_train, 1),
    num_mc_query=(num_mc_query, 1),
  )
  checks.rate("vampire", "outer_kl_weight", outer_kl_weight, positive=False)
  if kl_target not in KL_TARGETS:
    raise checks.fail("vampire", "kl_target", f"one of {', '.join(KL_TARGETS)}", repr(kl_target))
  loss_fn = losses.loss_from_apply(apply_fn, nll)
  inner_lr = default_inner_lr(nll, DEFAULT_INNER_LR) if inner_lr is None else inner_lr

  def target_of(prior: Gaussian) -> Optional[Gaussian]:
    return standard_normal_like(prior) if kl_target == "standard_normal" else None

  def init(params, key):
    return gaussian_from_params(params, key, log_std_init)

  def adapt(prior, support_x, support_y, key):
    return adaptation.adapt(
      prior,
      support_x,
      support_y,
      key,
      loss_fn=loss_fn,
      num_steps=num_inner_steps,
      inner_lr=inner_lr,
      num_mc_samples=num_mc_train,
      kl_weight=kl_weight,
      first_order=first_order,
      sample_batching=sample_batching,
      unroll_steps=unroll_steps,
      remat=remat,
      second_order_steps=second_order_steps,
      draw_outputs=draw_outputs,
      nll=None if draw_outputs is None else nll,
      kl_target=target_of(prior),
      backtracking=backtracking,
    )

  def predict(posterior, x, key):
    return adaptation.predict(
      posterior,
      x,
      key,
      apply_fn=apply_fn,
      num_mc_samples=num_mc_query,
      sample_batching=sample_batching,
      draw_outputs=draw_outputs,
    )

  # The query NLL's draws in a loop: each draw's gradient taken as it runs (`map_mean`).
  draws_in_a_loop = (
    draw_outputs is None and num_mc_query > 1 and sample_batching in batching.MAPPED_STRATEGIES
  )

  def meta_loss(prior, task, key):
    # `query_loss`'s adaptation and draws (its split of the key), plus the outer KL term.
    adapt_key, predict_key = jax.random.split(key)
    posterior = adapt(prior, task.support_x, task.support_y, adapt_key)
    if draws_in_a_loop:
      loss, outputs = _query_nll_by_draws(
        posterior, task.query_x, task.query_y, predict_key, apply_fn, nll, num_mc_query
      )
    else:
      outputs = predict(posterior, task.query_x, predict_key)
      loss = query_nll(nll, outputs, task.query_y)
    if not outer_kl_weight:
      return loss, outputs
    target = target_of(prior)
    outer_kl = kl_divergence(posterior, prior if target is None else target)
    return loss + outer_kl_weight * outer_kl, outputs

  return MetaLearner(
    init,
    adapt,
    predict,
    nll,
    meta_loss=meta_loss if outer_kl_weight or draws_in_a_loop else None,
    settings=InnerLoopSettings(loss_fn, inner_lr, kl_weight, num_inner_steps, kl_target),
  )


# The authors' defaults for Vampire2 (main.py of cnguyen10/few_shot_meta_learning at
# d797d9d): --KL-weight 1e-6, --first-order; the outer KL weight is the same KL_weight.
VAMPIRE2_KL_WEIGHT = 1e-6
# `vampire`'s keyword arguments that `vampire2` passes on from its `**options`, and its switches.
VAMPIRE2_OPTIONS = (
  "sample_batching",
  "unroll_steps",
  "remat",
  "second_order_steps",
  "draw_outputs",
  "backtracking",
)
VAMPIRE2_SWITCHES = ("unroll_steps", "remat", "backtracking")


def vampire2(
  apply_fn: losses.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  kl_weight: float = VAMPIRE2_KL_WEIGHT,
  outer_kl_weight: Optional[float] = None,
  num_mc_train: int = 1,
  num_mc_query: int = 1,
  first_order: bool = True,
  log_std_init: tuple[float, float] = (-4.0, -3.0),
  **options,
) -> MetaLearner:
  """Vampire2, the authors' VAMPIRE of 2021-2022 (`Vampire2.py`), with their defaults.

  `vampire(..., kl_target="standard_normal", outer_kl_weight=kl_weight)`: the inner loop
  fits the task posterior q with a KL to N(0, I) instead of the prior, and each task's
  meta-loss is the query NLL plus `outer_kl_weight * KL(q || N(0, I))`. The defaults are
  their `main.py`'s (d797d9d): `kl_weight` 1e-6 (`--KL-weight`), the same outer weight,
  first order (`--first-order`), 5 inner steps (`--num-inner-updates`), one weight draw
  (`--num-models 1`) and initial log-stds U[-4, -3] (`NormalVariationalNet`). `inner_lr`
  None is `vampire`'s: 0.01 (their `--inner-lr`), lowered to a Gaussian likelihood's
  `default_inner_lr` (their sine/line commands pass 0.001). `vj.specs.Vampire2()` in a run
  builds the same learner. Their reported KL subtracts a constant that the
  true KL here does not: their gradients are these (`tests/benchmark_scripts/test_authors_pytorch_head.py`).

  Args:
    apply_fn: the network, `apply_fn(params, x)`.
    nll: likelihood on outputs, e.g. `vj.categorical_nll`.
    num_inner_steps: S, the gradient steps of adaptation.
    inner_lr: alpha (None: `vampire`'s default).
    kl_weight: the inner loop's weight of KL(q || N(0, I)), against the mean NLL.
    outer_kl_weight: the meta-loss's weight of it (None: `kl_weight`, as theirs).
    num_mc_train: L_t, weight draws per inner step.
    num_mc_query: L_v, weight draws on the query set (and for prediction).
    first_order: stop gradients through the inner updates (theirs: True).
    log_std_init: the range of the initial log-stds (theirs: U[-4, -3]).
    **options: `vampire`'s other keyword arguments (`sample_batching`, `unroll_steps`,
      `remat`, `second_order_steps`, `draw_outputs`, `backtracking`). `kl_target` is
      refused (`InputError`): Vampire2's is N(0, I); `vj.vampire` takes `kl_target="prior"`.

  Raises:
    InputError: as `vampire` (a switch that is not True or False named as `vampire2`'s);
      and for `kl_target`.
    TypeError: a keyword argument it does not take, naming those it does.

  Examples:
    >>> model = vj.MLP((16,), 1)
    >>> learner = vj.vampire2(vj.pure_apply(model), vj.gaussian_nll(0.3))
    >>> learner.settings.kl_target, learner.settings.kl_weight
    ('standard_normal', 1e-06)
  """
  if "kl_target" in options:
    raise InputError(
      f"vampire2: kl_target is N(0, I) by Vampire2's definition and cannot be set, got "
      f"kl_target={options['kl_target']!r}; for a KL to the prior use "
      "vj.vampire(..., kl_target='prior')"
    )
  unknown = sorted(set(options) - set(VAMPIRE2_OPTIONS))
  if unknown:
    raise TypeError(
      f"vampire2: got an unexpected keyword argument {unknown[0]!r}; its options besides "
      f"those named in its signature are {', '.join(VAMPIRE2_OPTIONS)}"
    )
  switches = {name: options[name] for name in VAMPIRE2_SWITCHES if name in options}
  checks.flags("vampire2", first_order=first_order, **switches)
  return vampire(
    apply_fn,
    nll,
    num_inner_steps=num_inner_steps,
    inner_lr=inner_lr,
    kl_weight=kl_weight,
    num_mc_train=num_mc_train,
    num_mc_query=num_mc_query,
    first_order=first_order,
    log_std_init=log_std_init,
    kl_target="standard_normal",
    outer_kl_weight=kl_weight if outer_kl_weight is None else outer_kl_weight,
    **options,
  )


def maml(
  apply_fn: losses.ApplyFn,
  nll: losses.Likelihood,
  *,
  num_inner_steps: int = 5,
  inner_lr: Optional[float] = None,
  first_order: bool = False,
  unroll_steps: bool = False,
  remat: bool = False,
  second_order_steps: Optional[int] = None,
  backtracking: bool = False,
) -> MetaLearner:
  """MAML (Finn et al. 2017), VAMPIRE's point-estimate case: a `MetaLearner`.

  It builds: `init(params, key)`, the meta-parameters, which are the network's weights as
  given (no distribution, the key unused); `adapt`, `num_inner_steps` plain gradient steps
  of `inner_lr` on the support NLL from them (differentiated at second order unless
  `first_order` or `second_order_steps`); `predict(params, x, key)`, the adapted network's
  output as one draw, `[1, n, ...]`. Options as in `vampire`; `inner_lr` None: 0.1, or
  the likelihood's lower `default_inner_lr`.
  """
  checks.flags(
    "maml",
    first_order=first_order,
    unroll_steps=unroll_steps,
    remat=remat,
    backtracking=backtracking,
  )
  check_settings("maml", inner_lr, num_inner_steps=(num_inner_steps, 0))
  loss_fn = losses.loss_from_apply(apply_fn, nll)
  inner_lr = default_inner_lr(nll, 0.1) if inner_lr is None else inner_lr

  def init(params, key):
    del key
    return params

  def adapt(params, support_x, support_y, key):
    del key
    return adaptation.maml_adapt(
      params,
      support_x,
      support_y,
      loss_fn=loss_fn,
      num_steps=num_inner_steps,
      inner_lr=inner_lr,
      first_order=first_order,
      unroll_steps=unroll_steps,
      remat=remat,
      second_order_steps=second_order_steps,
      backtracking=backtracking,
    )

  def predict(params, x, key):
    del key
    adaptation.check_inputs("maml.predict", x)
    return apply_fn(params, x)[None]

  return MetaLearner(
    init, adapt, predict, nll, settings=InnerLoopSettings(loss_fn, inner_lr, 0.0, num_inner_steps)
  )


def adapt_to_task(
  learner: MetaLearner,
  meta_params: PyTree,
  support_x: jax.Array,
  support_y: jax.Array,
  key: jax.Array,
) -> tuple[PyTree, jax.Array]:
  """`(task_params, predict_key)`: one task's adaptation and the key of its predictions.

  `key` is split into the adaptation's key and the prediction's. The meta-training
  loss, the evaluators, `Run.predict` and `vj.predictive` all split it here (and
  `check_inner_loop` the same way), so one key gives the same weight draws in all.
  """
  adapt_key, predict_key = jax.random.split(key)
  return learner.adapt(meta_params, support_x, support_y, adapt_key), predict_key


def query_loss(
  learner: MetaLearner, meta_params: PyTree, task: Task, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """One task's meta-training loss: adapt on support, mean NLL on query.

  Args:
    learner: the algorithm.
    meta_params: its meta-parameters.
    task: one task (no leading task axis).
    key: PRNG key.

  Returns:
    `(loss, outputs)`: the query NLL averaged over weight draws (Alg. 1,
    line 9) and the query outputs `[num_samples, num_query, ...]`; or, if the
    learner defines its own `meta_loss`, what that returns.
  """
  if learner.meta_loss is not None:
    return learner.meta_loss(meta_params, task, key)
  task_params, query_key = adapt_to_task(learner, meta_params, task.support_x, task.support_y, key)
  outputs = learner.predict(task_params, task.query_x, query_key)
  return query_nll(learner.nll, outputs, task.query_y), outputs


def _query_nll_by_draws(
  posterior: Gaussian,
  query_x: jax.Array,
  query_y: jax.Array,
  key: jax.Array,
  apply_fn: losses.ApplyFn,
  nll: losses.Likelihood,
  num_samples: int,
) -> tuple[jax.Array, jax.Array]:
  """`query_nll` of `adaptation.predict`'s draws (mapped), and the draws' outputs.

  The same draws and values; its gradient is taken draw by draw as the draws
  run (`batching.map_mean`), so no draw's forward pass runs twice, as it does
  when "remat_map" predicts and the mean is differentiated after.
  """
  adaptation.check_prediction("predict", posterior, query_x, key, apply_fn, num_samples)
  weights = sample(posterior, key, num_samples)

  def one_draw(draw, shared):
    x, y = shared
    outputs = apply_fn(draw, x)
    return nll(outputs, y), outputs

  with _said_of_query_y():
    return batching.map_mean(one_draw, weights, (query_x, query_y))


@contextlib.contextmanager
def _said_of_query_y():
  """The likelihood's `InputError`, said of `query_y` against the outputs on `query_x`."""
  try:
    yield
  except InputError as error:
    raise InputError(f"query_y does not fit the network's outputs on query_x: {error}") from None


def query_nll(nll: losses.Likelihood, outputs: jax.Array, query_y: jax.Array) -> jax.Array:
  """The likelihood averaged over draws: outputs `[samples, num_query, ...]`.

  Raises:
    InputError: `query_y` does not fit the outputs (named as such).
  """
  with _said_of_query_y():
    per_draw = jax.vmap(nll, in_axes=(0, None))(outputs, query_y)
  return jnp.mean(per_draw)
