"""Where the time of one training step goes: a `jax.profiler` trace, summed per XLA operation.

    python -m benchmarks.profile_step                            # mini-ImageNet VAMPIRE, T=2, L=10
    python -m benchmarks.profile_step --tasks 1 --mc-samples 2   # the same step, ~10x less work
    python -m benchmarks.profile_step --settings omniglot_5w1s --tasks 4 --json profile.json
    python -m benchmarks.profile_step --sample-batching vmap --conv-impl patches   # a lever
    python -m benchmarks.profile_step --settings omniglot_5w1s --algorithm maml --tasks 8
    python -m benchmarks.profile_step --settings omniglot_5w1s --episode --tasks 1 --repeats 5

`--episode` traces a test episode instead (`suite --episodes`: VAMPIRE adapting
to and predicting `--tasks` tasks sampled beforehand, one jitted evaluator call).

Builds the training step of `benchmarks.suite` (tasks sampled inside the
step, the library's batching and convolution for this backend), compiles it,
runs it once, then traces `--repeats` steps with `jax.profiler.trace` and
reads the Perfetto trace it writes. XLA:CPU records one event per executed
operation ("thunk"), named as the instruction in the compiled HLO; loops
(`while`) record their body's operations on every trip. Each operation is
charged its exclusive time (its events less the events nested in them), and
the operations are grouped twice:

  by kind     the HLO opcode, a fusion by what it fuses (a convolution, a
              matrix product, a reduction, else element-wise);
  by source   the JAX operation that made it (`op_name` metadata of the
              instruction: e.g. `conv_general_dilated`, `dot_general`,
              `reduce_max`, `threefry2x32`), and whether it came from the
              forward pass, a transpose (backward pass) or a JVP;
  by part     the flax module that made it (`Conv4/conv1`, `Conv4/norm0`;
              the ReLU and max-pool show as `Conv4/relu`, `Conv4/reshape`,
              `Conv4/reduce_max`), or outside the network.

Shares are of the traced operations' total. They are meaningful on a loaded
machine (every operation is slowed alike, roughly); the seconds are not. Tracing
itself slows XLA:CPU's many small operations (the MAML Omniglot step at T=32: 7.8 s a
traced step against 1.5 untraced, 89,760 operations run), so shares lean towards
them; `benchmarks.filter_gradient_cost` measures one part's cost untraced, by removal.
`benchmarks.profile_step_pytorch` profiles the authors' step alike.

The report ends with the processor it ran on, `processor: ...` (the result's `processor`:
`vampire_jax.backend.processor_record()`).
"""

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import re
import tempfile
import time
from typing import Optional

from benchmarks import suite
from vampire_jax import backend

_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S+(?:\[[^\]]*\])?(?:\{[^}]*\})?\s+([\w\-]+)\("
)
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_FUSED_KINDS = (
  "convolution",
  "dot",
  "reduce-window",
  "select-and-scatter",
  "reduce",
  "scatter",
  "gather",
  "rng-bit-generator",
  "sort",
)


def parse_hlo(text: str) -> dict[str, dict]:
  """`{instruction name: {"opcode", "op_name", "kind"}}` from a compiled module's text."""
  computations, current, instructions = collections.defaultdict(list), None, {}
  for line in text.splitlines():
    header = _COMPUTATION.match(line)
    if header and "=" not in line.split("{")[0]:
      current = header.group(1)
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, opcode = match.groups()
    calls = _CALLS.search(line)
    op_name = _OP_NAME.search(line)
    instructions[name] = {
      "opcode": opcode,
      "calls": calls.group(1) if calls else None,
      "op_name": op_name.group(1) if op_name else "",
    }
    computations[current].append(opcode)
  for info in instructions.values():
    kind = info["opcode"]
    if kind == "fusion" and info["calls"] in computations:
      fused = computations[info["calls"]]
      kind = next((f"fusion ({k})" for k in _FUSED_KINDS if k in fused), "fusion (element-wise)")
    info["kind"] = kind
  return instructions


def source_of(op_name: str) -> str:
  """The JAX primitive and the pass that made an instruction, from its `op_name`."""
  if not op_name:
    return "(no op_name)"
  parts = op_name.split("/")
  primitive = re.sub(r"[\[(].*$", "", parts[-1]) or parts[-1]
  passes = "backward" if "transpose(" in op_name else "jvp" if "jvp(" in op_name else "forward"
  return f"{primitive} [{passes}]"


def part_of(op_name: str) -> str:
  """The network part (flax module path, e.g. `Conv4/conv1`) that made an instruction, if any."""
  # The module's name may sit inside transforms' brackets: `Conv4/conv1` (VAMPIRE's draws),
  # `jvp(Conv4)/conv1` and `transpose(jvp(Conv4))/conv1` (MAML's network, differentiated).
  match = re.search(r"/(?:\w+\()*([A-Z]\w*)\)*/(?:jit\()?(\w+)", op_name)
  if not match:
    return "outside the network (sampling, loops, KL, optimiser)"
  return f"{match.group(1)}/{match.group(2)}"


def exclusive_times(events: list[dict]) -> dict[str, float]:
  """Microseconds per event name, less the time of events nested inside it (same thread)."""
  totals = collections.defaultdict(float)
  by_thread = collections.defaultdict(list)
  for event in events:
    by_thread[(event.get("pid"), event.get("tid"))].append(event)
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []  # open events: [end, name, time of the events nested in it, duration]
    for event in thread_events + [{"ts": float("inf"), "dur": 0.0, "name": None}]:
      while stack and stack[-1][0] <= event["ts"]:
        _, name, nested, duration = stack.pop()
        totals[name] += duration - nested
        if stack:
          stack[-1][2] += duration
      if event["name"] is not None:
        stack.append([event["ts"] + event["dur"], event["name"], 0.0, event["dur"]])
  return totals


def read_trace(folder: str) -> list[dict]:
  paths = glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True)
  if not paths:
    raise RuntimeError(f"jax.profiler.trace wrote no perfetto_trace.json.gz under {folder}")
  with gzip.open(paths[0]) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  return [e for e in events if e.get("ph") == "X" and "dur" in e]


def summarise(times: dict[str, float], hlo: dict[str, dict], top: int) -> dict:
  """Shares of the traced XLA operations' exclusive time, by kind, by source and the `top` ones."""
  ops = {name: us for name, us in times.items() if name in hlo and hlo[name]["opcode"] != "while"}
  total = sum(ops.values()) or 1.0
  by_kind, by_source, by_part = collections.Counter(), collections.Counter(), collections.Counter()
  for name, us in ops.items():
    by_kind[hlo[name]["kind"]] += us
    by_source[source_of(hlo[name]["op_name"])] += us
    by_part[part_of(hlo[name]["op_name"])] += us

  def shares(counter):
    return [{"name": k, "share": v / total, "seconds": v * 1e-6} for k, v in counter.most_common()]

  heaviest = [
    {
      "name": n,
      "kind": hlo[n]["kind"],
      "source": source_of(hlo[n]["op_name"]),
      "share": us / total,
      "seconds": us * 1e-6,
      "op_name": hlo[n]["op_name"][-160:],
    }
    for n, us in sorted(ops.items(), key=lambda kv: -kv[1])[:top]
  ]
  return {
    "traced_op_seconds": total * 1e-6,
    "by_kind": shares(by_kind),
    "by_source": shares(by_source),
    "by_part": shares(by_part),
    "heaviest": heaviest,
  }


def profile(
  name: str,
  tasks: int,
  mc_samples: int,
  repeats: int,
  remat: bool,
  top: int,
  conv_impl: str = "auto",
  sample_batching: str = "auto",
  algorithm: str = "vampire",
  batching: Optional[str] = None,
  episode: bool = False,
  second_order_steps: Optional[int] = None,
) -> dict:
  """Compiles, runs once, traces `repeats` steps of `suite`'s step; returns `summarise`'s dict.

  `conv_impl` and `sample_batching` "auto": the library's choices (as `suite`).
  `algorithm`: "vampire" or "maml" (one weight draw, as in `suite`).
  `batching`: the tasks' STRATEGY[:CHUNK] (e.g. "vmap"); None: the library's choice.
  `episode`: trace `suite`'s test episode (adapt and predict) instead of a training step.
  """
  import jax
  import vampire_jax as vj

  if algorithm == "maml":
    mc_samples = 1
  setting = dataclasses.replace(
    suite.SETTINGS[name], tasks=tasks, mc_samples=mc_samples, conv_impl=conv_impl
  )
  draws = suite.draw_batching(setting, {"sample_batching": sample_batching})
  strategy, chunk = suite.choose_batching(setting, batching)
  strategy, chunk = backend.task_batching(strategy, chunk, tasks)
  if setting.conv_impl == "auto":
    setting = dataclasses.replace(
      setting,
      conv_impl=backend.conv_impl(
        task_batching=strategy,
        inner_steps_unrolled=False,
        draws_mapped=mc_samples > 1 and draws in backend.MAPPED_STRATEGIES,
      ),
    )
  apply_fn, params, nll = suite.network(setting)
  learner = suite.make_learner(
    setting,
    algorithm,
    apply_fn,
    nll,
    unroll_steps=False,
    remat=remat,
    sample_batching=draws,
    second_order_steps=second_order_steps,
  )
  if strategy == "host_chunked":
    raise ValueError(
      "--settings: host_chunked steps run several programs; profile a one-program step"
    )
  key = jax.random.key(3)
  mesh = None  # a test episode's evaluator runs on one device
  if episode:
    meta_params = learner.init(params, jax.random.key(1))
    episode_tasks = suite.random_tasks(setting, jax.random.key(2), tasks)
    if setting.kind == "regression":  # the suite's noise, 0.3
      evaluator = vj.make_regression_evaluator(
        learner, 0.3, task_batching=strategy, chunk_size=chunk
      )
    else:
      evaluator = vj.make_classification_evaluator(
        learner, task_batching=strategy, chunk_size=chunk
      )
    program, arguments = jax.jit(evaluator), (meta_params, episode_tasks, key)
  else:
    program, state, data, mesh = suite.train_step_as_a_run(
      setting,
      learner,
      params,
      strategy=strategy,
      chunk=chunk,
      donate=False,
      input_size=suite.input_size(setting),  # XLA:CPU's options as a run's
    )
    arguments = (state, data, key)
  start = time.perf_counter()
  compiled = program.lower(*arguments).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*arguments))
  folder = tempfile.mkdtemp(prefix="vj_profile_")
  start = time.perf_counter()
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    for _ in range(repeats):
      jax.block_until_ready(compiled(*arguments))
  step_s = (time.perf_counter() - start) / repeats
  hlo = parse_hlo(compiled.as_text())
  with open(f"{folder}/hlo_instructions.json", "w") as f:  # to summarise the trace again
    json.dump(hlo, f)
  events = read_trace(folder)
  result = summarise(exclusive_times(events), hlo, top)
  executed = sum(1 for e in events if e["name"] in hlo and hlo[e["name"]]["opcode"] != "while")
  result.update(
    operations_per_step=executed / repeats,  # thunks run, over every device's thread
    setting=name,
    algorithm=algorithm,
    episode=episode,
    tasks=tasks,
    mc_samples=mc_samples,
    remat=remat,
    sample_batching=sample_batching,
    batching=suite.batching_label(strategy, chunk, mesh),
    conv_impl=setting.conv_impl if setting.kind == "classification" else "none",
    compile_s=compile_s,
    traced_step_s=step_s,
    repeats=repeats,
    trace_folder=folder,
    processor=backend.processor_record(),
  )
  return result


def format_report(result: dict, rows: int = 12) -> str:
  header = (
    f"{result['setting']} {result.get('algorithm', 'vampire').upper()}, T={result['tasks']}, L={result['mc_samples']},"
    f" tasks {result['batching']}, draws {result['sample_batching']},"
    f" conv {result['conv_impl']}, remat {result['remat']}:"
    f" {result['repeats']} traced {'episode call' if result.get('episode') else 'step'}(s);"
    f" operations {result['traced_op_seconds']:.1f} s"
    f" of {result['traced_step_s'] * result['repeats']:.1f} s traced,"
    f" {result['operations_per_step']:,.0f} run per step"
  )
  lines = [header, ""]
  for title, key in (
    ("by kind", "by_kind"),
    ("by source (JAX operation [pass])", "by_source"),
    ("by network part", "by_part"),
  ):
    lines += [f"| {title} | share |", "|---|---|"]
    lines += [f"| {r['name']} | {100 * r['share']:.1f} % |" for r in result[key][:rows]]
    lines.append("")
  lines += ["| heaviest operations | kind | source | share |", "|---|---|---|---|"]
  lines += [
    f"| {r['name']} | {r['kind']} | {r['source']} | {100 * r['share']:.1f} % |"
    for r in result["heaviest"]
  ]
  lines += ["", suite.processor_line(result["processor"])]
  return "\n".join(lines)


def main(argv=None) -> dict:
  from benchmarks import arguments

  backend.default_to_all_cpu_cores()  # one XLA:CPU device per core
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--settings", default="mini_imagenet_5w1s", choices=tuple(suite.SETTINGS))
  parser.add_argument("--tasks", type=arguments.count(1), default=2)
  parser.add_argument("--mc-samples", type=arguments.count(1), default=10)
  parser.add_argument("--repeats", type=arguments.count(1), default=1)
  parser.add_argument("--remat", action="store_true")
  parser.add_argument("--top", type=int, default=15, help="heaviest operations listed")
  parser.add_argument(
    "--conv-impl",
    default="auto",
    choices=("auto", "xla", "patches", "loop_safe"),
    help="Conv4's convolution (auto: the library's choice)",
  )
  parser.add_argument(
    "--sample-batching",
    default="auto",
    choices=suite.DRAW_BATCHINGS,
    help="how the L draws are batched (auto: the library's choice)",
  )
  parser.add_argument("--algorithm", default="vampire", choices=("vampire", "maml"))
  parser.add_argument(
    "--batching", default=None, help="the tasks' STRATEGY[:CHUNK] (default: the library's)"
  )
  parser.add_argument(
    "--episode", action="store_true", help="trace a test episode (adapt + predict), not a step"
  )
  parser.add_argument(
    "--second-order-steps",
    type=arguments.count(0),
    default=None,
    help="inner steps differentiated at second order (default all; 1: the authors' code)",
  )
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  result = profile(
    args.settings,
    args.tasks,
    args.mc_samples,
    args.repeats,
    args.remat,
    args.top,
    args.conv_impl,
    args.sample_batching,
    args.algorithm,
    args.batching,
    args.episode,
    args.second_order_steps,
  )
  print(format_report(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
