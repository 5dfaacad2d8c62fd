"""tiered-ImageNet (or mini-ImageNet) 5-way on LEO's 640-d features: VAMPIRE or MAML, MLP 128-32.

    python -m experiments.tiered_imagenet --preset 5way1shot --data-dir /data/leo/embeddings
    python -m experiments.tiered_imagenet --preset 5way5shot --dataset mini --algorithm maml
    python -m experiments.tiered_imagenet --preset quick     # minutes on a CPU

Data: `--data-dir` (or env LEO_EMBEDDINGS_DIR; TIERED_IMAGENET_DIR for
tiered, MINI_IMAGENET_FEATURES_DIR for mini) is the folder unzipped from LEO's
`embeddings.zip` (github.com/google-deepmind/leo), holding
`{tieredImageNet,miniImageNet}/center/{train,val,test}_embeddings.pkl`; the
dataset or crop folder itself works too. See
`vampire_jax.data.load_leo_embeddings`. Each embedding is scaled to unit
norm, as LEO does.

Splits: LEO's (tiered: 351 / 97 / 160 classes, Ren et al.'s category split;
mini: Ravi & Larochelle's 64 / 16 / 20). tiered classes have 732 to 1300
images; episodes draw among each class's own. The paper reports 5000 test
tasks for tiered and 600 for mini. `--calibration-tasks N` also scores N
random 5-class combinations of the test classes (see experiments.mini_imagenet).
"""

import json
import sys
from pathlib import Path
from typing import Optional

import jax

import vampire_jax as vj
from experiments import calibration_protocol, cli, train
from experiments.presets import FEATURES_PRESETS as PRESETS
from experiments.presets import FeaturesConfig
from experiments.presets import features_config as get_config
from vampire_jax import data
from vampire_jax.runs import algorithms, kinds
from vampire_jax.runs import experiment_configs as configs


def load_splits(config: FeaturesConfig) -> dict[str, data.FeatureSplit]:
  return data.load_leo_embeddings(
    config.data_dir, config.dataset, crop=config.crop, l2_normalize=config.l2_normalize
  )


def make_problem(
  config: FeaturesConfig,
  workdir: Optional[Path] = None,
  splits: Optional[dict[str, data.FeatureSplit]] = None,
) -> vj.Problem:
  """Loads the embeddings (unless `splits` is given) and puts them on the device."""
  splits = splits or load_splits(config)
  train_ways = config.algorithm.training_ways(config.ways)  # ProtoNet's --train-ways, else --ways
  for name, split in splits.items():
    ways = train_ways if name == "train" else config.ways
    data.check_class_counts(split.counts, ways=ways, shots=config.shots, query=config.query)
  if workdir is not None:
    record = {
      name: {
        "num_classes": len(split.wnids),
        "num_examples": int(split.counts.sum()),
        "wnids": split.wnids.tolist(),
      }
      for name, split in splits.items()
    }
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "split.json").write_text(json.dumps(record, indent=1))

  episode = dict(ways=config.ways, shots=config.shots, query=config.query, rotate=False)
  num_unknown = configs.open_set_classes(config, len(splits["test"].wnids))

  def sample_tasks(split, task_keys):
    features, counts = split
    return data.tasks_from_keys(task_keys, features, **episode, class_counts=counts)

  def sample_train_tasks(split, task_keys):
    features, counts = split
    episode_ways = dict(episode, ways=train_ways)
    return data.tasks_from_keys(task_keys, features, **episode_ways, class_counts=counts)

  def sample_open_set_tasks(split, task_keys):
    features, counts = split
    return data.open_set_tasks_from_keys(
      task_keys, features, **episode, class_counts=counts, num_unknown=num_unknown
    )

  feature_size = next(iter(splits.values())).features.shape[-1]
  return vj.Problem(
    model=vj.MLP(
      tuple(config.hidden_sizes),
      algorithms.network_outputs(config),
      kernel_init_gain=config.kernel_init_gain,
    ),
    input_shape=(feature_size,),
    splits={
      name: (jax.device_put(split.features), jax.device_put(split.counts))
      for name, split in splits.items()
    },
    sample_tasks=sample_tasks,
    kind="classification",
    data_info={
      "dataset": f"{config.dataset}_imagenet_leo_features",
      "crop": config.crop,
      "folder": config.data_dir,
    },
    sample_open_set_tasks=sample_open_set_tasks if num_unknown else None,
    sample_train_tasks=sample_train_tasks if train_ways != config.ways else None,
  )


def default_workdir(config: FeaturesConfig, preset: str) -> Path:
  return (
    Path("runs") / f"{config.dataset}_features_{preset}_{config.algorithm.name}_seed{config.seed}"
  )


def run_experiment(
  config: FeaturesConfig,
  workdir: Path,
  *,
  progress: bool = True,
  splits=None,
  print_fn=print,
  init_from=None,
) -> dict:
  """Checks the config, loads the features, meta-trains, tests and draws the figures."""
  return train.run_experiment(
    config,
    workdir,
    lambda: make_problem(config, workdir, splits),
    progress=progress,
    print_fn=print_fn,
    init_from=init_from,
  )


def parse_args(argv=None):
  """`(config, workdir, args)` from the command line (flags as `--help` lists them)."""
  config, args = cli.parse(
    argv, __doc__, PRESETS, get_config, add_flags=calibration_protocol.add_flags
  )
  return config, args.workdir or default_workdir(config, args.preset), args


def main(argv=None) -> dict:
  config, workdir, args = parse_args(argv)
  print(
    f"{config.dataset}-ImageNet features {config.ways}-way {config.shots}-shot, "
    f"{config.algorithm.name}; workdir {workdir}; backend {jax.default_backend()}"
  )
  algorithms.check_config(config)
  splits = load_splits(config)
  results = {}
  if not args.calibration_only:
    results = run_experiment(
      config, workdir, progress=not args.no_progress, splits=splits, init_from=args.init_from
    )
    print(kinds.test_summary_line(results["test"], results["kind"]))
  test = splits["test"]
  calibration = calibration_protocol.run_protocol(
    workdir, args, jax.device_put(test.features), jax.device_put(test.counts)
  )
  if calibration is not None:
    results["calibration_protocol"] = calibration
  return results


if __name__ == "__main__":
  sys.exit(cli.main_entry(main))
