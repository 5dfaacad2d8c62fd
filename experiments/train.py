"""What every experiment's `run_experiment(config, workdir)` does, once.

Run the library's `vj.train_and_evaluate` with the function that builds the
problem (it checks the config and the folder before the data is loaded), then
draw the run's figures (and add them to its TensorBoard events).
"""

import math
from pathlib import Path
from typing import Callable

import jax

import vampire_jax as vj
from experiments import plots
from vampire_jax.runs import experiment_configs as configs
from vampire_jax.runs import reporting


def run_experiment(
  config,
  workdir: Path,
  make_problem: Callable[[], vj.Problem],
  *,
  progress: bool = True,
  print_fn=print,
  init_from=None,
) -> dict:
  """Runs one experiment; returns the results written to `workdir/results.json`.

  Args:
    config: the experiment's config.
    workdir: the run folder (resumed if it holds this config's run).
    make_problem: loads the data and builds the `vj.Problem`; called only
      once the config is known to be valid.
    progress: show progress.
    print_fn: where messages go.
    init_from: a trained run (`vj.Run` or its folder) to start a new run from
      (`vj.train_and_evaluate`'s `init_from`; `--init-from`).
  """
  if not (Path(workdir) / "run.json").exists():  # a new run: the loop checks its inner loop
    note = kl_step_note(config)
    if note:
      print_fn(note)
  if config.algorithm.name == "simpa":  # its cost, once the network is known, before it compiles
    make_problem = with_simpa_cost_note(make_problem, config, print_fn)
  results = vj.train_and_evaluate(
    make_problem, config, workdir, init_from=init_from, progress=progress, print_fn=print_fn
  )
  results = plots.add_run_figures(
    workdir, results, config.algorithm.name.upper(), setting_name(config)
  )
  if jax.process_index() == 0:
    reporting.write_figures(workdir, results["plots"], step=results["meta_steps"])
  return results


def kl_step_note(config) -> str:
  """Why the inner-loop check will warn about the KL step, where the settings are the paper's.

  At the initial prior the KL step's factor inner_lr * kl_weight / sigma^2 is largest at
  the narrowest sigma of the KL's target: for VAMPIRE and ABML the prior's narrowest
  initial log-std, `log_std_init[0]` (the paper's regression values, 0.001 and 1, give
  2.98 there, above the stable 2, and the loop's check warns); for Vampire2, whose KL is to
  N(0, I), sigma 1. Empty where the factor is below 2 or the algorithm's inner loop takes
  no KL step (MAML, PLATIPUS, BMAML, ProtoNet, SImPa).
  """
  spec = config.algorithm
  if not spec.inner_kl or not spec.kl_weight or spec.inner_lr is None:
    return ""
  if spec.kl_target == "standard_normal":
    inverse_variance, where = 1.0, "N(0, I), the KL's target (sigma 1)"
  else:
    inverse_variance = math.exp(-2 * config.algorithm.log_std_init[0])
    where = f"the prior's narrowest initial log-std ({config.algorithm.log_std_init[0]:g})"
  factor = config.algorithm.inner_lr * config.algorithm.kl_weight * inverse_variance
  if factor < 2:
    return ""
  stable = 1.9 / (config.algorithm.inner_lr * inverse_variance)
  return (
    f"note: --inner-lr {config.algorithm.inner_lr:g} and --kl-weight {config.algorithm.kl_weight:g} give the KL "
    f"step a factor inner_lr * kl_weight / sigma^2 of up to {factor:.2f} at {where}, above "
    "the stable 2, so the check below warns about it. The presets keep the paper's (and the "
    "authors' code's) values, and the runs in BUILD_NOTES.md trained with them "
    f'("Deviations"); --kl-weight {stable:.2g} or less keeps it below 2'
  )


# SImPa's meta-step on the 2-core development CPU (BUILD_NOTES.md, "SImPa, as `Simpa.py`
# runs it", "What it costs"): the regression preset (MLP 100-100-100, 20 501 weights, T = 10,
# S = 5) took 98 s at the authors' 512 KL draws and 13.6 s at 16. Nearly all of it is the
# matrices of 512 x (weights) of its generator and PHI network, applied in every inner step
# of every task to the KL's draws and the networks drawn, so a step scales with
# T * S * weights * (draws + 64): the one constant below fits both measurements (and gives
# 6.4 s for the Omniglot quick preset at 64 draws, measured at 5.5 s beside a test process).
SIMPA_SECONDS_PER_UNIT = 98.0 / (10 * 5 * 20501 * (512 + 64))


def simpa_cost_note(config, num_weights: int) -> str:
  """What a SImPa run will cost on a 2-core CPU, from its KL draws and network's weights."""
  draws = config.algorithm.num_kl_samples
  units = (
    config.schedule.tasks_per_step * config.algorithm.num_inner_steps * num_weights * (draws + 64)
  )
  seconds = SIMPA_SECONDS_PER_UNIT * units
  total = seconds * config.schedule.num_meta_steps
  total = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.0f} min"
  return (
    f"note: SImPa takes {draws} draws in each KL estimate (--simpa-kl-samples) and its "
    f"network has {num_weights:,} weights: about {seconds:.3g} s a meta-step on a 2-core "
    f"CPU, {total} for {config.schedule.num_meta_steps} steps (measured there on the regression "
    "preset's MLP: 98 s a step at the authors' 512 draws, 13.6 s at 16)"
  )


def with_simpa_cost_note(make_problem: Callable[[], vj.Problem], config, print_fn):
  """`make_problem`, then the note of `simpa_cost_note` for its network, before training."""

  def made() -> vj.Problem:
    problem = make_problem()
    shape = (1, *problem.input_shape)
    params = jax.eval_shape(lambda: vj.init_params(problem.model, jax.random.key(0), shape))
    print_fn(simpa_cost_note(config, sum(leaf.size for leaf in jax.tree.leaves(params))))
    return problem

  return made


def setting_name(config) -> str:
  """The data set and setting a figure's title names, e.g. "Omniglot 5-way 1-shot"."""
  if isinstance(config, configs.RegressionConfig):
    return f"sine/line regression, {config.num_support}-shot"
  if isinstance(config, configs.OmniglotConfig):
    data = "Omniglot"
  elif isinstance(config, configs.MiniImagenetConfig):
    data = "mini-ImageNet"
  elif isinstance(config, configs.FeaturesConfig):
    data = f"{config.dataset}-ImageNet (LEO features)"
  else:
    data = type(config).__name__.removesuffix("Config")
  ways, shots = getattr(config, "ways", None), getattr(config, "shots", None)
  return data if ways is None or shots is None else f"{data} {ways}-way {shots}-shot"
