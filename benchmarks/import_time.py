"""What `import vampire_jax` costs beside its stack, and what distrax would add.

    python -m benchmarks.import_time             # 7 fresh processes per row, the fastest kept

Each row imports in a fresh interpreter (`python -X importtime -c ...`) and sums the
top-level modules' cumulative times, so start-up and the shell are not counted. The issue
that moved distrax behind first use (the predictive) asks `import vampire_jax` to stay
within 2x of `import jax, flax, optax`. After the table it prints the processor it ran on,
with jaxlib's version, `processor: ...` (`benchmarks.suite.cpu_processor`, read without
starting JAX).
"""

import argparse
import subprocess
import sys

from benchmarks import suite

ROWS = {
  "jax, flax, optax": "import jax, flax, optax",
  "+ vampire_jax": "import jax, flax, optax, vampire_jax",
  "+ distrax (what an eager import would add)": "import jax, flax, optax, distrax",
  "vampire_jax, then vj.predictive's first call": (
    "import jax, vampire_jax as vj; "
    "vj.predictive_distribution(jax.numpy.zeros((2, 3, 1)), vj.gaussian_nll(0.3))"
  ),
}


def import_seconds(code: str) -> float:
  """Seconds spent importing in `python -c code`, from `-X importtime`'s top-level rows."""
  done = subprocess.run(
    [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
  )
  total_us = 0
  for line in done.stderr.splitlines():
    parts = line.split("|")
    if len(parts) == 3 and parts[1].strip().isdigit() and not parts[2].startswith("  "):
      total_us += int(parts[1])  # cumulative time of a module imported at the top level
  return total_us / 1e6


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  base = None
  print(f"| imports | seconds (fastest of {args.repeats}) | × jax, flax, optax |")
  print("|---|---|---|")
  for name, code in ROWS.items():
    seconds = min(import_seconds(code) for _ in range(args.repeats))
    base = base or seconds
    print(f"| {name} | {seconds:.2f} | {seconds / base:.2f} |")
  print(suite.processor_line(suite.cpu_processor()))


if __name__ == "__main__":
  main()
