"""The paper's calibration protocol: every N-class combination of the test classes.

Figure 4 of the paper scores 5-way 1-shot models on all C(20, 5) = 15 504
tasks made of mini-ImageNet's 20 test classes (15 query images per class) and
reports ECE / MCE with a reliability diagram. `evaluate_combinations` does
that for any classification run, on all combinations or on a random subset
of them (tiered-ImageNet's 160 test classes give 8.2e8):

  run = vj.load_run(workdir)
  results = evaluate_combinations(run, test_images, num_tasks=None, workdir=workdir)

It writes `calibration.json` (accuracy +- 95% CI, NLL, ECE, MCE, AURC, the
bins), `calibration_reliability.png` and `calibration_per_task.npz`.
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

import vampire_jax as vj
from experiments import plots
from vampire_jax import data
from vampire_jax import metrics
from vampire_jax.runs import experiment_configs as configs
from vampire_jax.runs import config_records, kinds, programs


def evaluate_combinations(
  run: vj.Run,
  class_images: jax.Array,
  *,
  num_tasks: Optional[int] = None,
  seed: int = 0,
  class_counts: Optional[jax.Array] = None,
  workdir: Optional[str | os.PathLike] = None,
) -> dict:
  """Scores a trained run on tasks made of every `config.ways`-class combination.

  Task r uses the classes `data.combination_at(ids[r])` (itertools order)
  with `config.shots` support and `configs.test_query(config)` query examples per class;
  its examples and Monte-Carlo draws depend only on `seed` and the
  combination's index, so the scores do not depend on the batch size. The
  test learner uses the run's `num_mc_test` draws.

  Args:
    run: from `vj.load_run`.
    class_images: `[C, E, ...]` test classes (device array).
    num_tasks: None for all C(C, ways) combinations, else a random subset of
      that many (`data.combination_ids(..., seed=seed)`).
    seed: seed of the subset, the examples and the Monte-Carlo draws.
    class_counts: `[C]` examples per class if classes are padded.
    workdir: where to write the results; None writes nothing.

  Returns:
    {'accuracy', 'accuracy_ci95', 'nll', 'ece', 'mce', 'aurc', 'num_tasks',
     'num_combinations', ...} as written to calibration.json.
  """
  start, config = time.time(), run.config
  query = configs.test_query(config)
  num_classes = int(class_images.shape[0])
  ids = data.combination_ids(num_classes, config.ways, num_tasks, seed=seed)
  if class_counts is not None:
    data.check_class_counts(
      np.asarray(class_counts), ways=config.ways, shots=config.shots, query=query
    )
  evaluate = programs.build_evaluator(run.kind, run.noise_std, config, run.learner)
  task_key, eval_key = jax.random.split(jax.random.key(seed))
  predict_keys = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(None, 0)))
  batch, outputs = config.evaluation.eval_batch_tasks, []
  for first in range(0, len(ids), batch):
    chunk = ids[first : first + batch]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk))])  # one shape
    tasks = data.combination_tasks(
      task_key,
      class_images,
      padded,
      num_classes=num_classes,
      ways=config.ways,
      shots=config.shots,
      query=query,
      class_counts=class_counts,
    )
    result = evaluate(run.meta_params, tasks, predict_keys(eval_key, np.asarray(padded, np.uint32)))
    outputs.append(
      {
        k: np.asarray(v)[: len(chunk)]
        for k, v in dict(result._asdict(), targets=tasks.query_y).items()
      }
    )
  per_task = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
  summary = kinds.summarise("classification", per_task, num_bins=config.evaluation.num_bins)
  results = {
    **summary.metrics,
    "num_combinations": data.num_combinations(num_classes, config.ways),
    "all_combinations": len(ids) == data.num_combinations(num_classes, config.ways),
    "seed": seed,
    "ways": config.ways,
    "shots": config.shots,
    "query": query,
    "num_mc_test": config.algorithm.test_draws,  # None: an algorithm without draws
    "calibration": {k: metrics.calibration_to_record(v) for k, v in summary.calibration.items()},
    "wall_time_s": time.time() - start,
  }
  if workdir is not None:
    _write(Path(workdir), results, summary, per_task, ids, config)
  return results


def _write(workdir: Path, results: dict, summary, per_task: dict, ids, config) -> None:
  workdir.mkdir(parents=True, exist_ok=True)
  label = config.algorithm.name.upper()
  results["plot"] = str(
    plots.plot_reliability_diagram(
      summary.calibration["reliability"],
      workdir / "calibration_reliability.png",
      title=f"{label}: {len(ids)} tasks, {config.ways}-way {config.shots}-shot",
    )
  )
  np.savez_compressed(
    workdir / "calibration_per_task.npz",
    combination_ids=ids,
    **{k: v for k, v in per_task.items() if k != "probabilities"},
  )
  record = {"config": config_records.to_record(config), **results}
  (workdir / "calibration.json").write_text(json.dumps(record, indent=2, default=float))


def add_flags(parser: argparse.ArgumentParser) -> None:
  """--calibration-tasks, --calibration-seed, --calibration-only."""
  parser.add_argument(
    "--calibration-tasks",
    type=_num_tasks,
    default=0,
    metavar="{N,all}",
    help="after testing, score every ways-class combination of the test "
    "classes ('all'; 15 504 for 5-way mini-ImageNet) or a random N of "
    "them; 0 (default) skips it",
  )
  parser.add_argument(
    "--calibration-seed",
    type=int,
    default=0,
    help="seed of the combination subset and draws (default: 0)",
  )
  parser.add_argument(
    "--calibration-only",
    action="store_true",
    help="skip training; score the run in --workdir (all combinations "
    "unless --calibration-tasks N)",
  )


def _num_tasks(value: str) -> int:
  """'all' -> -1, else a count (0: no calibration run)."""
  return -1 if value == "all" else int(value)


def run_protocol(
  workdir: Path,
  args: argparse.Namespace,
  test_images: jax.Array,
  test_counts: Optional[jax.Array] = None,
) -> Optional[dict]:
  """The calibration protocol on the run in `workdir`, if the flags ask for it."""
  if args.calibration_tasks == 0 and not args.calibration_only:
    return None
  num_tasks = args.calibration_tasks if args.calibration_tasks > 0 else None
  result = evaluate_combinations(
    vj.load_run(workdir),
    test_images,
    num_tasks=num_tasks,
    seed=args.calibration_seed,
    class_counts=test_counts,
    workdir=workdir,
  )
  print(
    f"calibration: {result['num_tasks']} of {result['num_combinations']} combinations: "
    f"accuracy {100 * result['accuracy']:.2f} +- {100 * result['accuracy_ci95']:.2f} %  "
    f"NLL {result['nll']:.4f}  ECE {result['ece']:.4f}  MCE {result['mce']:.4f}  "
    f"AURC {result['aurc']:.4f}; in {workdir / 'calibration.json'}"
  )
  return result
