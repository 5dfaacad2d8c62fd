import struct
from pathlib import Path

import pytest

from tests.conftest import needs_omniglot
from vampire_jax.runs import reporting, run_folder


def _tensorboard_events(folder: Path):
  """Every event in `folder`'s TensorBoard files, read back with tensorboardX's protos.

  An event file is a TFRecord: per record a little-endian uint64 length, its
  4-byte CRC, the serialised `Event`, and the data's 4-byte CRC.
  """
  from tensorboardX.proto import event_pb2

  for path in sorted(folder.glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (length,) = struct.unpack("<Q", data[i : i + 8])
      yield event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
      i += 12 + length + 4


def _scalars(folder: Path) -> dict:
  return {
    (v.tag, e.step): v.simple_value
    for e in _tensorboard_events(folder)
    for v in e.summary.value
    if v.HasField("simple_value")
  }


def test_damaged_json_is_read_as_missing_and_a_torn_log_line_is_cut(tmp_path):
  (tmp_path / "train_time.json").write_text("")
  (tmp_path / "best_score.json").write_text('{"st')
  notes = []
  assert run_folder.read_json(tmp_path / "train_time.json", print_fn=notes.append, default={}) == {}
  assert run_folder.read_json(tmp_path / "best_score.json", print_fn=notes.append) is None
  assert len(notes) == 2 and all("is damaged" in note for note in notes)
  log = tmp_path / "metrics.jsonl"
  log.write_text('{"step": 3, "train/loss": 1.5}\n{"step": 6, "train/lo')  # killed mid-write
  assert reporting.read_metrics(tmp_path) == [{"step": 3, "train/loss": 1.5}]
  writer = reporting.MetricWriter(tmp_path)
  writer.write(6, {"train/loss": 1.25})
  writer.close()
  assert reporting.read_metrics(tmp_path) == [
    {"step": 3, "train/loss": 1.5},
    {"step": 6, "train/loss": 1.25},
  ]


def test_tensorboard_gets_the_config_as_hparams_the_test_metrics_and_the_figures(tmp_path):
  pytest.importorskip("tensorboardX", reason="tensorboardX (the experiments extra) not installed")
  from tensorboardX.proto import plugin_hparams_pb2

  writer = reporting.MetricWriter(tmp_path)
  writer.write(10, {"train/loss": 1.25})
  config = {
    "algorithm": "vampire",
    "inner_lr": 0.1,
    "num_mc_test": 4,
    "log_std_init": [-4, -3],
    "data_dir": None,
    "remat": False,
  }
  writer.write_test(10, config, {"accuracy": 0.75, "num_tasks": 6, "open_set": {"auroc": 0.5}})
  writer.close()
  scalars = _scalars(tmp_path)
  assert scalars[("train/loss", 10)] == 1.25
  assert scalars[("test/accuracy", 10)] == 0.75 and scalars[("test/num_tasks", 10)] == 6
  assert not any(tag.startswith("test/open_set") for tag, _ in scalars)  # not a number: skipped
  assert reporting.read_metrics(tmp_path) == [{"step": 10, "train/loss": 1.25}]  # as before
  starts = [
    v.metadata.plugin_data.content
    for e in _tensorboard_events(tmp_path / "hparams")
    for v in e.summary.value
    if v.tag == "_hparams_/session_start_info"
  ]
  assert len(starts) == 1
  hparams = plugin_hparams_pb2.HParamsPluginData.FromString(starts[0]).session_start_info.hparams
  assert hparams["algorithm"].string_value == "vampire" and hparams["inner_lr"].number_value == 0.1
  assert hparams["num_mc_test"].number_value == 4 and hparams["remat"].bool_value is False
  assert (
    hparams["log_std_init"].string_value == "[-4, -3]"
    and hparams["data_dir"].string_value == "None"
  )
  assert _scalars(tmp_path / "hparams")[("test/accuracy", 10)] == 0.75
  # The figures: the PNG bytes as they are, with their size; other files skipped.
  png = tmp_path / "reliability.png"
  png.write_bytes(
    b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", 640, 480) + b"rest"
  )
  (tmp_path / "table.md").write_text("# not a figure")
  for event in _tensorboard_events(tmp_path):  # nothing yet
    assert not any(v.HasField("image") for v in event.summary.value)
  assert (
    reporting.write_figures(tmp_path, {"reliability": png, "table": tmp_path / "table.md"}, step=10)
    == 1
  )
  images = [
    (e.step, v.tag, v.image)
    for e in _tensorboard_events(tmp_path)
    for v in e.summary.value
    if v.HasField("image")
  ]
  assert [(step, tag) for step, tag, _ in images] == [(10, "figures/reliability")]
  assert images[0][2].encoded_image_string == png.read_bytes()
  assert (images[0][2].width, images[0][2].height) == (640, 480)


@needs_omniglot
def test_a_run_hands_tensorboard_its_config_test_metrics_and_figures(tiny_omniglot_run):
  pytest.importorskip("tensorboardX", reason="tensorboardX (the experiments extra) not installed")
  workdir, config, results = tiny_omniglot_run
  step = results["meta_steps"]
  hparams = _scalars(workdir / "hparams")
  for name in ("accuracy", "ece", "mce", "nll"):
    assert hparams[(f"test/{name}", step)] == pytest.approx(results["test"][name], rel=1e-6)
    assert _scalars(workdir)[(f"test/{name}", step)] == pytest.approx(
      results["test"][name], rel=1e-6
    )
  figures = {
    v.tag for e in _tensorboard_events(workdir) for v in e.summary.value if v.HasField("image")
  }
  assert figures == {f"figures/{name}" for name in results["plots"]}
  assert {"figures/reliability", "figures/risk_coverage", "figures/training_curves"} <= figures
