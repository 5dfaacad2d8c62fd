"""`experiments.variants`: several comparisons side by side (issue 29's table and figure)."""

import json

import numpy as np
import pytest

from experiments import plots, regression, variants

TINY = dict(
  hidden_sizes=(8, 8, 8),
  tasks_per_step=2,
  num_meta_steps=4,
  num_inner_steps=1,
  num_mc_train=2,
  num_mc_query=2,
  num_mc_test=4,
  num_val_tasks=4,
  num_test_tasks=6,
  eval_batch_tasks=2,
  eval_every=2,
  checkpoint_every=2,
  log_every=2,
  num_plot_tasks=2,
)


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
  root = tmp_path_factory.mktemp("variants")
  folders = {}
  for name, changes in (("a", {}), ("b", {"log_std_weight_decay": 0.5})):
    folders[name] = root / name
    regression.run(["vampire", "maml"] if name == "a" else ["vampire"], "quick", folders[name],
                   dict(TINY, **changes), progress=False)  # fmt: skip
  return folders


def test_the_table_reads_every_method_and_fills_a_variant_from_another(comparisons, tmp_path):
  table = variants.main(
    [
      "--variant",
      f"a: before={comparisons['a']}",
      "--variant",
      f"b: + decay={comparisons['b']},{comparisons['b'] / 'vampire'}",
      "--fallback",
      "b=a",
      "--figure",
      str(tmp_path / "ece.png"),
      "--json",
      str(tmp_path / "table.json"),
    ]
  )
  a, b = table["a: before"], table["b: + decay"]
  assert set(a) == {"vampire", "maml"} and set(b) == {"vampire", "maml"}
  assert len(b["vampire"]) == 2  # two folders given: two "seeds" (the same run twice here)
  assert b["maml"][0]["fallback"] == "a: before"  # MAML has no log-stds to decay
  saved = json.loads((comparisons["a"] / "vampire" / "results.json").read_text())["test"]
  assert a["vampire"][0]["ece"] == saved["ece"]
  per_task = np.load(comparisons["a"] / "vampire" / "test_per_task.npz")["mse"]
  assert a["vampire"][0]["median_mse"] == pytest.approx(float(np.median(per_task)))
  # The decay widened the prior (its mean log-std, logged while training).
  assert b["vampire"][0]["log_std"] > a["vampire"][0]["log_std"]
  assert "log_std" not in a["maml"][0]
  text = variants.to_markdown(table)
  assert "| VAMPIRE | b: + decay |" in text and "| MAML | b: + decay (= a: before) |" in text
  assert (tmp_path / "ece.png").stat().st_size > 10_000
  assert json.loads((tmp_path / "table.json").read_text()).keys() == table.keys()


def test_a_folder_without_runs_is_refused(tmp_path):
  assert variants.entry(["--variant", f"a={tmp_path}"]) == 2
  assert variants.entry(["--variant", f"a={tmp_path}", "--fallback", "b=a"]) == 2


def test_one_method_is_a_bar_per_variant_at_the_mean_of_its_seeds(tmp_path, monkeypatch):
  table = {
    "a": {"vampire": [{"ece": 0.1}, {"ece": 0.2}]},
    "b": {"vampire": [{"ece": 0.05}]},
    "c": {"vampire": [{"diverged": True}]},
  }
  drawn = {}
  monkeypatch.setattr(
    plots, "_save", lambda fig, path, title: drawn.setdefault("fig", fig) and path
  )
  plots.plot_variant_bars(table, "ece", tmp_path / "ece.png")
  (ax,) = drawn["fig"].axes
  assert [bar.get_width() for bar in ax.patches] == pytest.approx([0.15, 0.05, 0.0])
  assert [label.get_text() for label in ax.get_yticklabels()] == ["a", "b", "c"]
