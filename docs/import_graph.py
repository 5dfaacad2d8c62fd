"""Draws the import graph of the project's modules: who imports whom.

    python docs/import_graph.py                      # the working tree -> docs/import_graph.png
    python docs/import_graph.py --rev 9740219 --out docs/import_graph_before.png

Modules are the .py files under vampire_jax/ and experiments/ (a package's
`__init__` is left out: it only re-exports). An arrow A -> B means A imports
B. Each module belongs to a layer folder (`LAYERS`: _src/deprecations, _src/core,
_src/metrics, data and baselines, runs with specs, backend and metrics, experiments); an import of a later layer
from an earlier one is an upward arrow, and the script prints how many there
are, and how many import cycles. Modules are placed in layers by their longest chain of imports, leaves at
the bottom. To keep the picture readable, an import that a chain of other
imports already implies (A -> C when A -> B -> C) is not drawn (the
transitive reduction); the counts printed are of all imports.
"""

import argparse
import ast
import subprocess
from pathlib import Path

PACKAGES = ("vampire_jax", "experiments")
# The layer folders, from the bottom: a module may import its own layer and those below.
LAYERS = (
  ("vampire_jax._src.deprecations",),  # old paths' table: imports nothing of the library
  ("vampire_jax._src.core.",),
  ("vampire_jax._src.metrics.",),
  ("vampire_jax.data.", "vampire_jax.baselines."),
  ("vampire_jax.runs.", "vampire_jax.specs", "vampire_jax.backend", "vampire_jax.metrics"),
  ("experiments.",),
)
COLOURS = ("#eeeeee", "#dbe9f6", "#e2f0d9", "#ede1f5", "#fbe3e3", "#fde7c8")


def layer_of(name: str) -> int:
  """The index in `LAYERS` of the folder that holds module `name`."""
  for index, prefixes in enumerate(LAYERS):
    if name.startswith(prefixes):
      return index
  raise ValueError(f"{name} is in no layer folder of LAYERS")


def upward_arrows(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
  """The imports of a later layer's module by an earlier layer's."""
  return sorted(
    (name, target)
    for name, targets in edges.items()
    for target in targets
    if layer_of(target) > layer_of(name)
  )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """One cycle of imports through each module that is on one (depth-first search)."""
  found, state = [], {}

  def visit(name, path):
    state[name] = "open"
    for target in sorted(edges[name]):
      if state.get(target) == "open":
        found.append(path[path.index(target) :] + [target])
      elif target not in state:
        visit(target, path + [target])
    state[name] = "done"

  for name in sorted(edges):
    if name not in state:
      visit(name, [name])
  return found


def _sources(rev: str | None, repo: Path) -> dict[str, str]:
  """`{module name: source}` of the packages, from the working tree or a git revision."""
  if rev is None:
    files = [
      p.relative_to(repo).as_posix() for package in PACKAGES for p in (repo / package).rglob("*.py")
    ]
    read = lambda path: (repo / path).read_text()  # noqa: E731
  else:
    listing = subprocess.run(
      ["git", "ls-tree", "-r", "--name-only", rev, *PACKAGES],
      cwd=repo,
      capture_output=True,
      text=True,
      check=True,
    ).stdout.split()
    files = [f for f in listing if f.endswith(".py")]
    read = lambda path: (
      subprocess.run(
        ["git", "show", f"{rev}:{path}"],
        cwd=repo,  # noqa: E731
        capture_output=True,
        text=True,
        check=True,
      ).stdout
    )
  return {f[:-3].replace("/", "."): read(f) for f in files if not f.endswith("__init__.py")}


def _imports(name: str, source: str, modules: set[str]) -> set[str]:
  """The project modules that `name` imports (`from pkg import mod` counts as mod)."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      found.add(node.module)
      found.update(f"{node.module}.{alias.name}" for alias in node.names)
  return {m for m in found if m in modules and m != name}


def graph(rev: str | None, repo: Path) -> dict[str, set[str]]:
  sources = _sources(rev, repo)
  return {name: _imports(name, source, set(sources)) for name, source in sources.items()}


def _layers(edges: dict[str, set[str]]) -> dict[str, int]:
  depth = {}

  def layer(name, seen=()):
    if name not in depth:
      below = [layer(m, seen + (name,)) for m in edges[name] if m not in seen]
      depth[name] = 1 + max(below, default=-1)
    return depth[name]

  for name in edges:
    layer(name)
  return depth


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
  seen, todo = set(), list(edges[start])
  while todo:
    name = todo.pop()
    if name not in seen:
      seen.add(name)
      todo.extend(edges[name])
  return seen


def transitive_reduction(edges: dict[str, set[str]]) -> dict[str, set[str]]:
  """The imports that no chain of other imports implies."""
  return {
    name: {t for t in targets if not any(t in _reachable(edges, other) for other in targets - {t})}
    for name, targets in edges.items()
  }


def _order_rows(
  rows: dict[int, list[str]], edges: dict[str, set[str]], passes: int = 8
) -> dict[int, list[str]]:
  """Orders each layer by the mean position of its neighbours (fewer crossings)."""
  neighbours = {name: set(targets) for name, targets in edges.items()}
  for name, targets in edges.items():
    for target in targets:
      neighbours[target].add(name)
  for _ in range(passes):
    position = {name: (i + 0.5) / len(row) for row in rows.values() for i, name in enumerate(row)}
    for level, row in rows.items():
      rows[level] = sorted(
        row,
        key=lambda n: (
          sum(position[m] for m in neighbours[n]) / len(neighbours[n])
          if neighbours[n]
          else position[n]
        ),
      )
  return rows


def draw(edges: dict[str, set[str]], path: Path, title: str) -> None:
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  depth = _layers(edges)
  edges = transitive_reduction(edges)
  rows: dict[int, list[str]] = {}
  for name in sorted(edges, key=lambda n: (not n.startswith("vampire_jax"), n)):
    rows.setdefault(depth[name], []).append(name)
  rows = _order_rows(rows, edges)
  width = max(len(r) for r in rows.values())
  fig = Figure(figsize=(2.3 * width, 1.3 * len(rows) + 1), layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.subplots()
  where = {
    name: ((i + 0.5) * width / len(row), level)
    for level, row in rows.items()
    for i, name in enumerate(row)
  }
  for name, targets in edges.items():
    for target in targets:
      (x0, y0), (x1, y1) = where[name], where[target]
      ax.annotate(
        "",
        xy=(x1, y1),
        xytext=(x0, y0),
        arrowprops=dict(
          arrowstyle="->",
          lw=0.7,
          alpha=0.6,
          color="tab:gray",
          shrinkA=9,
          shrinkB=9,
          connectionstyle="arc3,rad=0.08",
        ),
      )
  for name, (x, y) in where.items():
    colour = COLOURS[layer_of(name)]
    ax.text(
      x,
      y,
      name.replace("vampire_jax._src.", "")
      .replace("vampire_jax.", "vj.")
      .replace("experiments.", "exp."),
      ha="center",
      va="center",
      fontsize=8,
      bbox=dict(boxstyle="round", fc=colour, ec="black", lw=0.5),
    )
  ax.set(xlim=(-0.2, width + 0.2), ylim=(-0.6, len(rows) - 0.4), title=title)
  ax.axis("off")
  fig.savefig(path, dpi=110)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rev", default=None, help="a git revision (default: the working tree)")
  parser.add_argument("--out", type=Path, default=Path("docs/import_graph.png"))
  parser.add_argument(
    "--text", action="store_true", help="also print each module's layer and the imports drawn"
  )
  args = parser.parse_args(argv)
  repo = Path(__file__).resolve().parents[1]
  edges = graph(args.rev, repo)
  if args.text:
    layers, reduced = _layers(edges), transitive_reduction(edges)
    for name in sorted(edges, key=lambda n: (layers[n], n)):
      print(layers[name], name, "->", ", ".join(sorted(reduced[name])))
  label = args.rev or "working tree"
  drawn = sum(map(len, transitive_reduction(edges).values()))
  draw(
    edges,
    args.out,
    f"imports at {label}: {len(edges)} modules, "
    f"{sum(map(len, edges.values()))} imports ({drawn} drawn), "
    f"{1 + max(_layers(edges).values())} layers",
  )
  print(
    f"{args.out}: {len(edges)} modules, {sum(map(len, edges.values()))} imports, "
    f"{drawn} not implied by others, {1 + max(_layers(edges).values())} layers; "
    f"{len(cycles(edges))} cycles, {len(upward_arrows(edges))} upward arrows"
  )


if __name__ == "__main__":
  main()
