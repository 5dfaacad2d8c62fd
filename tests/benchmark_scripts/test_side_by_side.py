"""The side-by-side runner builds like-for-like commands and tabulates what they write.

No process is run here (the PyTorch side needs torch, which CI has not);
`python -m benchmarks.side_by_side --tasks 2 --mc-samples 2 --repeats 1 --rounds 1`
is the smoke test (BUILD_NOTES.md, "Side by side with the authors' algorithm in PyTorch").
"""

from benchmarks import side_by_side, suite

OPTIONS = side_by_side.options_from_args(
  side_by_side.build_parser().parse_args(["--torch-python", "/torch/bin/python"])
)


def _after(command, flag):
  return command[command.index(flag) + 1]


def test_both_sides_get_the_authors_truncation_and_the_same_sizes():
  options = dict(OPTIONS, tasks=2, mc_samples=4)
  for row in side_by_side.ROWS:
    ours = side_by_side.our_command(row, options, "ours.json")
    theirs = side_by_side.torch_command(row, options, "theirs.json")
    assert theirs[:2] == [
      "/torch/bin/python",
      str(side_by_side.REPO / "benchmarks/authors_pytorch.py"),
    ]
    assert _after(theirs, "--rows") == row and _after(theirs, "--json") == "theirs.json"
    assert _after(ours, "--json") == "ours.json"
    assert _after(ours, "--repeats") == _after(theirs, "--repeats") == "3"
    if row.startswith("episode_"):
      assert "--episodes" in ours
      for flag in ("--episode-tasks", "--episode-mc-samples"):
        assert _after(ours, flag) == _after(theirs, flag)
      continue
    assert _after(ours, "--tasks") == _after(theirs, "--tasks") == "2"
    if row == "omniglot_maml":
      assert "--second-order-steps" not in ours  # second order in every step, on both sides
    else:
      assert _after(ours, "--second-order-steps") == _after(theirs, "--second-order-steps") == "1"
    if row.startswith("omniglot_"):  # L = 1 on both sides: benchmarks.meta_step has no L
      assert ours[:3] == [ours[0], "-m", "benchmarks.meta_step"]
      assert "--mc-samples" not in ours and "--mc-samples" not in theirs
    else:
      assert _after(ours, "--mc-samples") == _after(theirs, "--mc-samples") == "4"
  full = side_by_side.torch_command("omniglot_vampire", dict(OPTIONS, second_order_steps=None), "x")
  assert _after(full, "--second-order-steps") == "all"
  assert "--second-order-steps" not in side_by_side.our_command(
    "omniglot_vampire", dict(OPTIONS, second_order_steps=None), "x"
  )


def test_the_table_pairs_rounds_and_marks_a_failed_process():
  def train(seconds, peak):
    row = {"tasks": 32, "mc_samples": 1, "step_s": seconds, "peak_mb": peak, "compile_s": 9.0}
    return [dict(row, stepping_peak_mb=peak - 100.0)]

  def episodes(one, many):
    return [
      {"tasks": 1, "mc_samples": 10, "episode_s": one, "peak_mb": 100.0},
      {"tasks": 32, "mc_samples": 10, "episode_s": many, "peak_mb": 200.0},
    ]

  runs = [
    {"row": "omniglot_vampire", "side": "torch", "round": 1, "results": train(2.0, 500.0)},
    {"row": "omniglot_vampire", "side": "ours", "round": 1, "results": train(1.0, 900.0)},
    {"row": "omniglot_vampire", "side": "ours", "round": 2, "results": train(1.5, 950.0)},
    {"row": "omniglot_vampire", "side": "torch", "round": 2, "results": train(2.5, 520.0)},
    {"row": "episode_vampire_omniglot", "side": "torch", "round": 1, "results": episodes(1.0, 8.0)},
    {"row": "episode_vampire_omniglot", "side": "ours", "round": 1, "results": []},  # failed
  ]
  entries = side_by_side.collect(runs, [1, 32])
  train_entry = entries[0]
  assert train_entry["torch_s"] == [2.0, 2.5] and train_entry["ours_s"] == [1.0, 1.5]
  assert train_entry["round_ratios"] == [2.0, 2.5 / 1.5]
  assert train_entry["ratio"] == 2.25 / 1.25
  assert (train_entry["torch_peak_mb"], train_entry["ours_peak_mb"]) == (520.0, 950.0)
  assert (train_entry["torch_stepping_mb"], train_entry["ours_stepping_mb"]) == (420.0, 850.0)
  assert [e["tasks"] for e in entries[1:]] == [1, 32]
  table = side_by_side.format_table(entries).splitlines()
  assert table[2] == (
    "| omniglot_vampire | 32 | 1 | 2.000 / 2.500 | 1.000 / 1.500 | 1.80 (2.00 / 1.67) | 520 / 950 |"
    " 420 / 850 |"
  )
  assert table[4].startswith("| episode_vampire_omniglot (s/call) | 32 | 10 | 8.000 / failed |")
  assert "failed / failed" in table[4]


def test_suite_takes_the_truncation_and_l_from_the_command_line():
  options = {"quick": False, "tasks": 0, "mc_samples": 3}
  assert suite._row_setting("mini_imagenet_5w1s", options).mc_samples == 3
  assert suite._row_setting("regression", dict(options, mc_samples=0)).mc_samples == 128
  assert (
    suite._row_setting("mini_imagenet_5w1s", dict(options, quick=True, mc_samples=0)).mc_samples
    == 2
  )
