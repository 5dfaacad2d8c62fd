"""The paper's calibration protocol: every N-class combination of the test classes.

Figure 4 of the paper scores 5-way 1-shot models on all C(20, 5) = 15 504
tasks made of mini-ImageNet's 20 test classes (15 query images per class) and
reports ECE / MCE with a reliability diagram. `evaluate_combinations` does
that for any classification experiment, on all combinations or on a random
subset of them (tiered-ImageNet's 160 test classes give 8.2e8):

  meta_params = runner.restore_meta_params(problem, config, workdir)
  results = evaluate_combinations(problem, config, meta_params, test_images,
                                  num_tasks=None, workdir=workdir)

It writes `calibration.json` (accuracy +- 95% CI, NLL, ECE, MCE, the bins),
`calibration_reliability.png` and `calibration_per_task.npz` to `workdir`.
"""

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np

from experiments import runner
from vampire_jax import data
from vampire_jax import plotting

PyTree = Any


def evaluate_combinations(
    problem: runner.Problem,
    config: runner.RunConfig,
    meta_params: PyTree,
    class_images: jax.Array,
    *,
    num_tasks: Optional[int] = None,
    seed: int = 0,
    class_counts: Optional[jax.Array] = None,
    workdir: Optional[str | os.PathLike] = None,
    progress: bool = False,
) -> dict:
  """Scores `meta_params` on tasks made of every `config.ways`-class combination.

  Task r uses the classes `data.combination_at(ids[r])` (itertools order)
  with `config.shots` support and `config.query` query examples per class,
  drawn with a key derived from `seed` and the combination's index; the test
  learner uses `config.num_mc_test` samples, as `train_and_evaluate` does.

  Args:
    problem: the experiment's problem (network, likelihood).
    config: its config (ways, shots, query, num_mc_test, eval_batch_tasks,
      num_bins, batching).
    meta_params: e.g. from `runner.restore_meta_params`.
    class_images: `[C, E, ...]` test classes (device array).
    num_tasks: None for all C(C, ways) combinations, else a random subset of
      that many (`data.combination_ids(..., seed=seed)`).
    seed: seed of the subset, the examples and the Monte-Carlo draws.
    class_counts: `[C]` examples per class if classes are padded.
    workdir: where to write the results; None writes nothing.
    progress: show a progress bar.

  Returns:
    {'accuracy', 'accuracy_ci95', 'nll', 'nll_ci95', 'ece', 'mce',
     'num_tasks', 'num_combinations', ...} as written to calibration.json.
  """
  start = time.time()
  num_classes = int(class_images.shape[0])
  ids = data.combination_ids(num_classes, config.ways, num_tasks, seed=seed)
  if class_counts is not None:
    data.check_class_counts(np.asarray(class_counts), ways=config.ways, shots=config.shots,
                            query=config.query)
  learner = runner.make_learner(problem, config, config.num_mc_test, config.num_mc_test)
  evaluate = runner.build_evaluator(problem, config, learner)
  task_key, eval_key = jax.random.split(jax.random.key(seed))

  batch = config.eval_batch_tasks
  starts = range(0, len(ids), batch)
  if progress:
    from tqdm import tqdm
    starts = tqdm(starts, desc="combinations", unit="batch", leave=False)
  outputs = []
  for first in starts:
    chunk = ids[first:first + batch]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk))])  # one shape
    tasks = data.combination_tasks(task_key, class_images, padded, num_classes=num_classes,
                                   ways=config.ways, shots=config.shots, query=config.query,
                                   class_counts=class_counts)
    result = evaluate(meta_params, tasks, jax.random.fold_in(eval_key, first))
    outputs.append({k: np.asarray(v)[:len(chunk)]
                    for k, v in dict(result._asdict(), targets=tasks.query_y).items()})
  per_task = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}

  summary = runner.summarise(problem, per_task, config.num_bins)
  bins = summary["_bins"]
  results = {
      **{k: v for k, v in summary.items() if not k.startswith("_")},
      "num_combinations": data.num_combinations(num_classes, config.ways),
      "all_combinations": len(ids) == data.num_combinations(num_classes, config.ways),
      "seed": seed,
      "ways": config.ways, "shots": config.shots, "query": config.query,
      "num_mc_test": config.num_mc_test,
      "calibration": runner.calibration_record(summary),  # the bins, as in results.json
      "wall_time_s": time.time() - start,
  }
  if workdir is not None:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    label = config.algorithm.upper()
    results["plot"] = str(plotting.plot_reliability_diagram(
        {label: bins}, workdir / "calibration_reliability.png",
        title=f"{label}: {len(ids)} tasks, {config.ways}-way {config.shots}-shot"))
    np.savez_compressed(workdir / "calibration_per_task.npz", combination_ids=ids,
                        **{k: v for k, v in per_task.items() if k != "probabilities"})
    record = {"config": dataclasses.asdict(config), **results}
    (workdir / "calibration.json").write_text(json.dumps(record, indent=2, default=float))
  return results


def add_flags(parser: argparse.ArgumentParser) -> None:
  """--calibration-tasks, --calibration-seed, --calibration-only."""
  parser.add_argument("--calibration-tasks", type=_num_tasks, default=0, metavar="{N,all}",
                      help="after testing, score every ways-class combination of the test "
                           "classes ('all'; 15 504 for 5-way mini-ImageNet) or a random N of "
                           "them; 0 (default) skips it")
  parser.add_argument("--calibration-seed", type=int, default=0)
  parser.add_argument("--calibration-only", action="store_true",
                      help="skip training; score the best checkpoint in --workdir (all "
                           "combinations unless --calibration-tasks N)")


def _num_tasks(value: str) -> int:
  """'all' -> -1, else a count (0: no calibration run)."""
  return -1 if value == "all" else int(value)


def run_experiment(problem: runner.Problem, config: runner.RunConfig, workdir: Path,
                   args: argparse.Namespace, test_images: jax.Array,
                   test_counts: Optional[jax.Array] = None, progress: bool = True) -> dict:
  """Trains and tests (unless --calibration-only), then the calibration protocol if asked.

  Returns:
    `train_and_evaluate`'s results (if it ran), with the calibration results
    under 'calibration_protocol' (if asked).
  """
  results = {}
  if not args.calibration_only:
    results = runner.train_and_evaluate(problem, config, workdir, progress=progress)
    print(runner.accuracy_line(results["test"], Path(workdir) / "results.json"))
  if args.calibration_tasks != 0 or args.calibration_only:
    meta_params = runner.restore_meta_params(problem, config, workdir)
    num_tasks = args.calibration_tasks if args.calibration_tasks > 0 else None
    calibration = evaluate_combinations(
        problem, config, meta_params, test_images, num_tasks=num_tasks,
        seed=args.calibration_seed, class_counts=test_counts, workdir=workdir,
        progress=progress)
    print(f"calibration: {calibration['num_tasks']} of {calibration['num_combinations']} "
          f"combinations: accuracy {100 * calibration['accuracy']:.2f} +- "
          f"{100 * calibration['accuracy_ci95']:.2f} %  NLL {calibration['nll']:.4f}  "
          f"ECE {calibration['ece']:.4f}  MCE {calibration['mce']:.4f}; "
          f"in {Path(workdir) / 'calibration.json'}")
    results["calibration_protocol"] = calibration
  return results
