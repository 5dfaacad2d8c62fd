"""Where the time of the authors' training step goes: PyTorch's profiler, summed per aten operation.

    PYTHONPATH=$PWD /path/to/torch/python -m benchmarks.profile_step_pytorch --row omniglot_maml
    PYTHONPATH=$PWD /path/to/torch/python -m benchmarks.profile_step_pytorch --row omniglot_maml \\
        --threads 1 --json theirs.json                              # one core: core-seconds

The PyTorch side of `benchmarks.profile_step` (issue 62, item 5): the meta-step that
`benchmarks.side_by_side` times for the authors' code (`benchmarks/authors_pytorch.py`, the
same tasks, network, inner loop and optimiser), run once, then `--repeats` steps under
`torch.profiler.profile` (CPU). Each aten operation is charged its self time (its time less
that of the operations nested in it), and grouped as `benchmarks.profile_step` groups XLA's:

  by kind    convolution, convolution backward, matrix product, batch norm (and its
             backward), reduction, element-wise, copy and layout (copies, views, `cat`,
             allocation), optimiser and clipping, other
  heaviest   the operations by self time

"outside the operators" is the step's wall time less the operators' self time on the
calling thread: Python, the autograd engine's bookkeeping and the profiler itself.

The report ends with the processor it ran on, `processor: ...` (the result's `processor`:
`benchmarks.suite.cpu_processor`, read after the profiled steps without starting JAX, as
`benchmarks.authors_pytorch` names its rows'; None where the library is not installed).

Needs torch and numpy only (and this repository on PYTHONPATH).
"""

import argparse
import collections
import json
import re
import time

from benchmarks import suite

# torch and `benchmarks.authors_pytorch` are imported where a step is built, so that the
# grouping below can be read (and tested) without PyTorch.

# aten operation -> kind, first match wins (names without the "aten::" prefix).
_KINDS = (
  ("convolution backward", r"convolution_backward|mkldnn_convolution_backward"),
  ("convolution", r"conv|mkldnn_convolution"),
  ("matrix product", r"^(mm|addmm|bmm|matmul|linear|baddbmm)$"),
  ("batch norm", r"batch_norm"),
  ("optimiser and clipping", r"_foreach|adam|clip|norm$|linalg_vector_norm"),
  (
    "reduction",
    r"^(sum|mean|max|min|amax|amin|logsumexp|var|std)$|softmax|nll_loss",
  ),
  (
    "copy and layout",
    r"copy|clone|contiguous|empty|zeros|ones|fill|view|reshape|as_strided|expand|permute"
    r"|transpose|^t$|cat|stack|select|slice|index|unsqueeze|squeeze|to$|_to_copy|detach"
    r"|alias|resize|lift|new_",
  ),
  (
    "element-wise",
    r"add|sub|mul|div|relu|threshold|neg|exp|log|sqrt|rsqrt|pow|where|lt|gt|eq|ne|isnan"
    r"|sigmoid|tanh|abs|sign|maximum|minimum|clamp|randn|normal|rand",
  ),
)


def kind_of(name: str) -> str:
  """The kind of an aten operation (`aten::convolution_backward` -> "convolution backward")."""
  short = name.split("::", 1)[-1]
  for kind, pattern in _KINDS:
    if re.search(pattern, short):
      return kind
  return "other"


def summarise(averages, wall_us: float, top: int) -> dict:
  """Shares of the traced step's wall time, by kind of aten operation and the `top` ones."""
  ops = {
    a.key: float(a.self_cpu_time_total)
    for a in averages
    if a.key.startswith("aten::") and a.self_cpu_time_total > 0
  }
  ops_us = sum(ops.values())
  calls = sum(a.count for a in averages if a.key.startswith("aten::"))
  by_kind = collections.Counter()
  for name, us in ops.items():
    by_kind[kind_of(name)] += us
  by_kind["outside the operators"] = max(wall_us - ops_us, 0.0)
  total = sum(by_kind.values()) or 1.0

  def share(us):
    return {"share": us / total, "seconds": us * 1e-6}

  return {
    "traced_wall_seconds": wall_us * 1e-6,
    "operator_seconds": ops_us * 1e-6,
    "operator_calls": calls,  # nested calls (aten::conv2d -> aten::convolution -> ...) included
    "by_kind": [{"name": k, **share(v)} for k, v in by_kind.most_common()],
    "heaviest": [
      {"name": n, "kind": kind_of(n), **share(us)}
      for n, us in sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    ],
  }


def profile(row: str, options: dict, repeats: int, top: int) -> dict:
  """Builds the row's step as `authors_pytorch.run_train_row`, runs it once, profiles `repeats`."""
  import torch

  from benchmarks import authors_pytorch

  torch.set_num_threads(options["threads"])
  name, algorithm = authors_pytorch.ROWS[row]
  if algorithm == "episode":
    raise SystemExit(f"--row {row}: a test episode; profile a training row")
  setting, _, step, tasks = authors_pytorch.train_row_step(row, options)
  step(tasks)  # the first step (allocations, oneDNN's kernel choice) is not traced
  untraced = time.perf_counter()
  step(tasks)
  untraced_s = time.perf_counter() - untraced
  activities = [torch.profiler.ProfilerActivity.CPU]
  with torch.profiler.profile(activities=activities) as prof:
    start = time.perf_counter()
    for _ in range(repeats):
      step(tasks)
    wall_s = time.perf_counter() - start
  result = summarise(prof.key_averages(), wall_s * 1e6, top)
  result.update(
    row=row,
    setting=name,
    algorithm=algorithm,
    tasks=setting.tasks,
    mc_samples=setting.mc_samples,
    threads=options["threads"],
    repeats=repeats,
    traced_step_s=wall_s / repeats,
    untraced_step_s=untraced_s,
    torch=torch.__version__,
    processor=suite.cpu_processor(with_jaxlib=False),
  )
  return result


def format_report(result: dict) -> str:
  lines = [
    f"{result['setting']} {result['algorithm'].upper()} (the authors' code, PyTorch"
    f" {result['torch']}, {result['threads']} thread(s)), T={result['tasks']},"
    f" L={result['mc_samples']}: {result['repeats']} traced step(s) of"
    f" {result['traced_step_s']:.3f} s ({result['untraced_step_s']:.3f} s untraced);"
    f" operators {result['operator_seconds']:.2f} s of {result['traced_wall_seconds']:.2f} s,"
    f" {result['operator_calls'] / result['repeats']:,.0f} aten calls per step",
    "",
    "| by kind | share | s/step |",
    "|---|---|---|",
  ]
  lines += [
    f"| {r['name']} | {100 * r['share']:.1f} % | {r['seconds'] / result['repeats']:.4f} |"
    for r in result["by_kind"]
  ]
  lines += ["", "| heaviest operations | kind | share |", "|---|---|---|"]
  lines += [f"| {r['name']} | {r['kind']} | {100 * r['share']:.1f} % |" for r in result["heaviest"]]
  lines += ["", suite.processor_line(result["processor"])]
  return "\n".join(lines)


def main(argv=None) -> dict:
  from benchmarks import arguments

  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  arguments.needs_modules(parser, "this benchmark of the authors' PyTorch step", "torch")
  from benchmarks import authors_pytorch

  training_rows = [r for r, (_, a) in authors_pytorch.ROWS.items() if a != "episode"]
  parser.add_argument("--row", default="omniglot_maml", choices=training_rows)
  parser.add_argument("--repeats", type=int, default=3, help="traced steps after two untraced")
  parser.add_argument(
    "--tasks", type=arguments.count(1), default=None, help="T (default: the row's)"
  )
  parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  parser.add_argument("--top", type=int, default=15, help="heaviest operations listed")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  if args.repeats < 1:
    parser.error(f"--repeats {args.repeats}: at least 1")
  options = authors_pytorch.options_from_args(
    authors_pytorch.build_parser().parse_args(
      ["--threads", str(args.threads), "--seed", str(args.seed)]
      + (["--tasks", str(args.tasks)] if args.tasks else [])
    )
  )
  result = profile(args.row, options, args.repeats, args.top)
  print(format_report(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
