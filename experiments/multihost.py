"""Runs an experiment over several hosts: `jax.distributed.initialize()`, then the experiment.

Start the same command on every host, one process per host, changing only
`--process-id` (0 on the host whose address is the coordinator):

    python -m experiments.multihost --coordinator-address host0:12345 --num-processes 2 \\
        --process-id 0 omniglot --preset 5way1shot --algorithm vampire --workdir /shared/runs/omni

Under SLURM, Open MPI or on Cloud TPU the three flags can be left out: JAX
reads them from the environment (also JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). Everything after the experiment's name
goes to that experiment's own flags.

Every host then sees all hosts' devices; the runner splits each meta-batch
of tasks over all of them (`--shard-tasks auto`), each process sampling its
own share of the tasks. T (`--tasks-per-step`) must be divisible by the total
number of devices. The workdir must be on a file system all hosts share
(checkpoints are written by every process; logs, plots and results.json by
process 0).
"""

import argparse
import importlib

EXPERIMENTS = ("omniglot", "mini_imagenet", "tiered_imagenet", "regression")


def main(argv=None):
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--coordinator-address", default=None, help="host:port of process 0")
  parser.add_argument("--num-processes", type=int, default=None)
  parser.add_argument("--process-id", type=int, default=None)
  parser.add_argument("experiment", choices=EXPERIMENTS)
  parser.add_argument("experiment_args", nargs=argparse.REMAINDER)
  args = parser.parse_args(argv)

  import vampire_jax as vj

  vj.initialize_multihost(args.coordinator_address, args.num_processes, args.process_id)
  return importlib.import_module(f"experiments.{args.experiment}").main(args.experiment_args)


if __name__ == "__main__":
  main()
