"""SImPa's inner loop at initialisation on the regression preset: why its runs diverge.

    python -m benchmarks.simpa_inner_loop                 # seeds 0 and 1, every variant
    python -m benchmarks.simpa_inner_loop --seeds 0 --kl-samples 16

For each seed and variant this builds the run exactly as `experiments.compare --benchmark
regression --algorithms simpa --preset cpu --seed S` does before it compiles (the same
initial meta-parameters and the same training task, from the run's keys) and runs the
check the loop runs there (`vj.check_inner_loop`): the support loss before and after the
inner loop. Variants: the preset (MLP 100-100-100, Gaussian NLL at sigma 0.3, inner lr
1e-3); inner lr 1e-4 and 1e-5; and the authors' regression network and loss (FcNet 40-40,
the MSE, i.e. --likelihood-std 0.7071). Before the table it prints the processor it runs
on, `processor: ...` (`vampire_jax.backend.processor_record()`).
"""

import argparse
import sys
import time

import jax

from benchmarks import suite
from experiments import cli, regression
from vampire_jax import backend
from vampire_jax.runs import algorithms, inner_loop_check, loop, programs

VARIANTS = {
  "preset (MLP 100-100-100, NLL sigma 0.3, inner lr 1e-3)": {},
  "inner lr 1e-4": {"inner_lr": 1e-4},
  "inner lr 1e-5": {"inner_lr": 1e-5},
  "the authors' FcNet 40-40 and MSE, inner lr 1e-3": {
    "hidden_sizes": (40, 40),
    "likelihood_std": 0.7071,
  },
}


def support_loss_change(seed: int, kl_samples: int, changes: dict) -> tuple[float, float]:
  """The support loss before and after SImPa's inner loop, as the run's check measures it."""
  config = regression.get_config("cpu", "simpa").replace(
    seed=seed, num_kl_samples=kl_samples, **changes
  )
  problem = regression.make_problem(config)
  learner = loop.learner_for(problem, config)
  init_key = programs.run_keys(config.seed).init
  optimizer = algorithms.make_optimizer(config)
  state = loop._initial_state(problem, config, learner, optimizer, init_key, None)
  key = inner_loop_check.check_key(init_key)
  report = inner_loop_check.inner_loop_report(problem, learner, state.meta_params, key)
  return report.loss_before, report.loss_after


def _seeds(text: str) -> list[int]:
  """`--seeds`: comma-separated integers >= 0."""
  try:
    seeds = [int(s) for s in text.split(",")]
  except ValueError:
    seeds = []
  if not seeds or min(seeds) < 0:
    raise argparse.ArgumentTypeError(f"comma-separated integers >= 0 (e.g. 0,1), not {text!r}")
  return seeds


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seeds", type=_seeds, default="0,1", help="comma-separated (default: 0,1)")
  parser.add_argument(
    "--kl-samples",
    type=cli.count_at_least(2, "SImPa's KL estimate needs two draws"),
    default=512,
    help="draws in each KL estimate (default: 512)",
  )
  args = parser.parse_args(argv)
  print(f"SImPa, regression `cpu` preset, {args.kl_samples} KL draws, {jax.default_backend()}")
  print(suite.processor_line(backend.processor_record()))
  print("| variant | seed | support loss before | after the inner loop | seconds |")
  print("|---|---|---|---|---|")
  for name, changes in VARIANTS.items():
    for seed in args.seeds:
      start = time.perf_counter()
      before, after = support_loss_change(seed, args.kl_samples, changes)
      seconds = time.perf_counter() - start
      print(f"| {name} | {seed} | {before:.4g} | {after:.4g} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
