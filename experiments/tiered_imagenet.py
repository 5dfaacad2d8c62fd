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

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

import jax

import vampire_jax as vj
from experiments import calibration_protocol, cli, runner
from vampire_jax import data

PRESETS = ("5way1shot", "5way5shot", "quick")


@dataclasses.dataclass
class FeaturesConfig(runner.RunConfig):
  dataset: str = "tiered"          # 'tiered' or 'mini'
  crop: str = "center"             # 'center', or 'multiview' (mini only)
  l2_normalize: bool = True        # as LEO
  ways: int = 5
  shots: int = 1
  query: int = 15
  hidden_sizes: tuple[int, int] = (128, 32)
  data_dir: Optional[str] = None   # default: env LEO_EMBEDDINGS_DIR (see module doc)
  # vmap over tasks: per-task MLP weights become batched matmuls, fast on a
  # CPU as well (the host-chunked CPU default is for convolutions).
  task_batching: str = "vmap"
  eval_task_batching: str = "vmap"


def get_config(preset: str = "5way1shot", algorithm: str = "vampire") -> FeaturesConfig:
  """The paper's features settings: MLP 128-32, inner lr 0.01, 5 steps, KL weight 0.1.

  The paper gives neither T, L nor the training length for features; we use
  T = 16, L_t = L_v = 10 (the MLP is cheap) and 30 000 steps (480 000 tasks,
  as for Omniglot), 5000 test tasks. `quick`: 300 steps of 8 tasks with
  inner lr 0.1 and KL weight 0.001, as Omniglot's quick preset, so that it
  learns visibly in a CPU minute.
  """
  if preset in ("5way1shot", "5way5shot"):
    config = FeaturesConfig(
        shots=int(preset[4]), tasks_per_step=16, num_meta_steps=30_000, inner_lr=0.01,
        num_mc_train=10, num_mc_query=10, num_mc_test=10, num_val_tasks=500,
        num_test_tasks=5000, eval_batch_tasks=100, eval_every=1000, checkpoint_every=1000,
        log_every=100)
  elif preset == "quick":
    config = FeaturesConfig(
        tasks_per_step=8, num_meta_steps=300, inner_lr=0.1, kl_weight=0.001,
        num_val_tasks=100, num_test_tasks=500, eval_batch_tasks=50, eval_every=100,
        checkpoint_every=100, log_every=25, num_mc_test=4)
  else:
    raise ValueError(f"unknown preset {preset!r}; expected one of {PRESETS}")
  cli.set_algorithm(config, algorithm)
  return config


def load_splits(config: FeaturesConfig) -> dict[str, data.FeatureSplit]:
  return data.load_leo_embeddings(config.data_dir, config.dataset, crop=config.crop,
                                  l2_normalize=config.l2_normalize)


def make_problem(config: FeaturesConfig, workdir: Optional[Path] = None,
                 splits: Optional[dict[str, data.FeatureSplit]] = None) -> runner.Problem:
  """Loads the embeddings (unless `splits` is given) and puts them on the device."""
  splits = splits or load_splits(config)
  for split in splits.values():
    data.check_class_counts(split.counts, ways=config.ways, shots=config.shots,
                            query=config.query)
  if workdir is not None:
    record = {name: {"num_classes": len(split.wnids), "num_examples": int(split.counts.sum()),
                     "wnids": split.wnids.tolist()} for name, split in splits.items()}
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "split.json").write_text(json.dumps(record, indent=1))
  device_splits = {name: (jax.device_put(split.features), jax.device_put(split.counts))
                   for name, split in splits.items()}

  def sample_tasks(split, key, num_tasks):
    features, counts = device_splits[split]
    return data.sample_tasks_with_counts(key, features, counts, num_tasks=num_tasks,
                                         ways=config.ways, shots=config.shots,
                                         query=config.query)

  model = vj.MLP(tuple(config.hidden_sizes), config.ways)
  feature_size = next(iter(splits.values())).features.shape[-1]
  return runner.Problem(
      apply_fn=vj.pure_apply(model),
      init_params=lambda key: vj.init_params(model, key, (1, feature_size)),
      nll=vj.categorical_nll, sample_tasks=sample_tasks, kind="classification")


def default_workdir(config: FeaturesConfig, preset: str) -> Path:
  return Path("runs") / f"{config.dataset}_features_{preset}_{config.algorithm}_seed{config.seed}"


def parse_args(argv=None) -> tuple[FeaturesConfig, Path, bool, argparse.Namespace]:
  return cli.parse_experiment_args(
      argv, __doc__, FeaturesConfig, PRESETS, get_config, default_workdir,
      add_flags=calibration_protocol.add_flags,
      choices={"dataset": ["tiered", "mini"], "crop": ["center", "multiview"]})


def main(argv=None) -> dict:
  config, workdir, progress, args = parse_args(argv)
  print(f"{config.dataset}-ImageNet features {config.ways}-way {config.shots}-shot, "
        f"{config.algorithm}; workdir {workdir}; backend {jax.default_backend()}")
  splits = load_splits(config)
  problem = make_problem(config, workdir, splits)
  test = splits["test"]
  return calibration_protocol.run_experiment(problem, config, workdir, args,
                                             jax.device_put(test.features),
                                             jax.device_put(test.counts), progress=progress)


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
