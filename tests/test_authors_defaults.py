"""Defaults against the authors' code (issue 59, item 3): the stride-2 padding theirs uses when
asked for, old runs as they were, ProtoNet's distance said, and the user guide's table of
every difference naming flags that exist.

Their `CommonModels.CNN` pads its stride-2 convolutions with one row and column on each side
(PyTorch's `padding=1`); our Conv4 pads as XLA's 'SAME' (0 before, 1 after on an even size) unless
`padding="symmetric"` (`--conv-padding symmetric`). The PyTorch ports' equality tests on their
network: tests/test_authors_pytorch_head.py and ..._simpa.py (torch only).
"""

import json
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vampire_jax as vj
from experiments import cli, omniglot, presets
from vampire_jax._src.core import models
from vampire_jax._src.core.errors import ConfigError
from vampire_jax.runs import config_records, run_config, settings

ROOT = Path(__file__).resolve().parents[1]


def _conv4(padding, conv_impl="xla", max_pool=False):
  return vj.Conv4(
    num_classes=3, num_filters=4, max_pool=max_pool, conv_impl=conv_impl, padding=padding
  )


def _images(size=28, channels=1):
  return jax.random.uniform(jax.random.key(0), (2, size, size, channels))


def test_symmetric_padding_pads_one_on_each_side_as_torch_padding_1():
  # The first block by hand: lax's convolution with ((1, 1), (1, 1)), then the batch norm.
  x = _images()
  model = _conv4("symmetric")
  params = vj.init_params(model, jax.random.key(1), (1, 28, 28, 1))
  kernel, bias = params["conv0"]["kernel"], params["conv0"]["bias"]
  first = jax.lax.conv_general_dilated(
    x, kernel, (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  first = first + bias
  captured = model.apply({"params": params}, x, capture_intermediates=True, mutable="intermediates")
  ours = captured[1]["intermediates"]["conv0"]["__call__"][0]
  assert ours.shape == (2, 14, 14, 4)  # 28 -> 14, as 'SAME' gives: the sizes do not change
  np.testing.assert_allclose(ours, first, rtol=1e-6, atol=1e-6)
  same = _conv4("same").apply(
    {"params": params}, x, capture_intermediates=True, mutable="intermediates"
  )
  assert np.abs(same[1]["intermediates"]["conv0"]["__call__"][0] - ours).max() > 1e-2


@pytest.mark.parametrize("conv", [models.PatchConv, models.LoopSafeConv])
def test_stride_two_pads_as_written_on_odd_and_even_sizes(conv):
  # Zeros padded by hand, then a 'VALID' convolution. XLA's 'SAME' pads 0 before and 1 after
  # on an even size (8 -> 4) but 1 on each side on an odd one (7 -> 4); "symmetric" pads 1 on
  # each side on both, as PyTorch's `padding=1`.
  for size, same in ((8, (0, 1)), (7, (1, 1))):
    x = _images(size, 2)
    for padding, pads in (("same", same), ("symmetric", (1, 1))):
      layer = conv(3, strides=2, padding=padding)
      params = layer.init(jax.random.key(1), x)["params"]
      padded = jnp.pad(x, ((0, 0), pads, pads, (0, 0)))
      expected = jax.lax.conv_general_dilated(
        padded, params["kernel"], (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
      )
      ours = layer.apply({"params": params}, x)
      assert ours.shape == (2, 4, 4, 3)
      np.testing.assert_allclose(ours, expected + params["bias"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # three convolutions' second-order programs to compile
@pytest.mark.parametrize("padding", models.PADDINGS)
def test_every_convolution_pads_alike_to_second_order(padding):
  # xla, patches and loop_safe (its hand-written gradient) give the same logits, gradient and
  # gradient of the gradient's norm, on 28 -> 14 -> 7 -> 4 -> 2 (odd sizes at the third).
  x, labels = _images(), jnp.array([0, 2])
  params = vj.init_params(_conv4(padding), jax.random.key(1), (1, 28, 28, 1))
  results = []
  for impl in models.CONV_IMPLS:
    apply = vj.pure_apply(_conv4(padding, impl))
    loss = lambda p: vj.categorical_nll(apply(p, x), labels)  # noqa: E731
    squared = lambda p: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(loss)(p)))  # noqa: E731
    curvature = jax.grad(squared)(params)
    results.append((apply(params, x), jax.grad(loss)(params), curvature))
  for other in results[1:]:
    for first, second in zip(results[0], other):  # logits, gradient, curvature
      # Of the largest entry: the convolutions' bias gradients, before a batch norm, are 0
      # up to rounding.
      scale = max(float(jnp.abs(a).max()) for a in jax.tree.leaves(first))
      for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        assert float(jnp.abs(a - b).max()) / scale < 2e-4


def test_stride_one_pads_one_on_each_side_either_way():
  # mini-ImageNet's network (stride 1, max-pool): the two paddings are the same padding.
  x = _images(22, 3)
  params = vj.init_params(_conv4("same", max_pool=True), jax.random.key(1), (1, 22, 22, 3))
  same = _conv4("same", max_pool=True).apply({"params": params}, x)
  symmetric = _conv4("symmetric", max_pool=True).apply({"params": params}, x)
  np.testing.assert_array_equal(same, symmetric)


def test_an_unknown_padding_is_refused():
  with pytest.raises(ValueError, match="padding must be one of"):
    _conv4("reflect").apply(
      {"params": vj.init_params(_conv4("same"), jax.random.key(1), (1, 28, 28, 1))}, _images()
    )
  with pytest.raises(
    ConfigError, match="conv_padding must be one of same, symmetric, got 'reflect'"
  ) as refused:
    presets.omniglot_config("quick").replace(conv_padding="reflect").validate()
  # A command says it in its flags.
  assert "--conv-padding must be one of same, symmetric" in str(cli.as_flags(refused.value))


def test_a_run_recorded_before_the_field_pads_as_it_did():
  # A zoo cell's run.json (its config recorded flat, the old format) has no `padding` in its
  # network nor `conv_padding` in its config: it is rebuilt with XLA's padding, and the
  # command's config equals its record there.
  record = json.loads((ROOT / "zoo/omniglot_original_quick_vampire/run.json").read_text())
  assert "padding" not in record["model"]["fields"]
  assert "conv_padding" not in record["config"]
  assert models.module_from_spec(record["model"]).padding == "same"
  config = presets.omniglot_config("quick").replace(
    **{k: v for k, v in record["config"].items() if k in ("seed",)},
  )
  saved = config_records.flat(record["config"])
  assert "conv_padding" not in run_config.config_differences(saved, config)


def test_the_flag_reaches_the_network(monkeypatch):
  # `--conv-padding symmetric` on the command line: the config and the Problem's Conv4 carry it.
  config, _ = cli.parse(
    ["--preset", "quick", "--conv-padding", "symmetric"],
    "test",
    presets.OMNIGLOT_PRESETS,
    presets.omniglot_config,
  )
  assert config.conv_padding == "symmetric"
  for preset in presets.OMNIGLOT_PRESETS:  # every preset keeps XLA's, as its zoo cells
    assert presets.omniglot_config(preset).conv_padding == "same"
  tiny = np.zeros((5, 20, 28, 28), np.uint8)  # no data needed to build the network
  monkeypatch.setattr(omniglot.data, "make_split", lambda *a, **k: dict.fromkeys(_SPLITS, tiny))
  problem = omniglot.make_problem(config, arrays=types.SimpleNamespace(provenance={}))
  assert problem.model.padding == "symmetric"
  assert (
    omniglot.make_problem(
      presets.omniglot_config("quick"), arrays=types.SimpleNamespace(provenance={})
    ).model.padding
    == "same"
  )


_SPLITS = ("train", "val", "test")


def test_protonet_keeps_snells_squared_distance_and_says_the_authors_differ():
  for experiment in ("omniglot", "mini_imagenet"):
    for preset in presets.PRESETS[experiment]:
      if preset == "authors2019":
        continue  # VAMPIRE's only
      config = presets.get_config(experiment, preset, "protonet")
      assert config.algorithm.distance == "squared_euclidean"
  help_text = settings.field_help(vj.specs.Protonet)["distance"]  # --protonet-distance
  assert "Snell" in help_text and "euclidean (the VAMPIRE authors' ProtoNet.py" in help_text


def _guide_section() -> str:
  text = (ROOT / "docs/user_guide.md").read_text()
  start = text.index("## Where the experiments differ from the authors' `main.py`")
  return text[start : text.index("\n## ", start + 1)]


def test_the_user_guides_table_names_every_difference_and_real_flags():
  section = _guide_section()
  for setting in (
    "ProtoNet's distance",
    "padding of the stride-2 convolutions",
    "batch norm's scale and offset",
    "Omniglot filters",
    "initial means",
    "regression loss",
    "meta-optimiser",
    "Vampire2's reported KL",
  ):
    assert f"| {setting}" in section, setting
  # The last column names our flags (the second names the authors' `main.py` flags).
  rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")]
  flags = {flag for row in rows[1:] for flag in re.findall(r"`(--[a-z0-9-]+)", row[-1])}
  assert {"--protonet-distance", "--conv-padding", "--no-batch-norm-affine"} <= flags
  # and one flag per field of the config, its parts and every algorithm's spec (`--no-` for a
  # boolean)
  known = {"--preset", "--algorithm"}
  for config_class in (
    presets.OmniglotConfig,
    presets.MiniImagenetConfig,
    presets.RegressionConfig,
  ):
    for name in cli.config_fields(config_class()):
      known |= {cli.flag(name), cli.flag(name).replace("--", "--no-", 1)}
  assert flags <= known, flags - known
