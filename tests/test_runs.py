"""Other JAX code uses a trained run: `vj.load_run` in two lines, public preprocessing,
scores independent of the evaluation batch."""

import io
import json
import subprocess
import sys
import textwrap
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import vampire_jax as vj
from vampire_jax._src.metrics.evaluation import evaluate_split
from conftest import OMNIGLOT_DIR, needs_omniglot
from experiments import omniglot
from experiments.presets import OmniglotConfig
from vampire_jax._src.metrics import evaluation
from vampire_jax.runs import programs


@needs_omniglot
def test_load_run_and_predict_in_a_fresh_process_without_tensorflow(tiny_omniglot_run):
  workdir = tiny_omniglot_run[0]
  script = textwrap.dedent(f"""
      import json, sys
      import jax, numpy as np
      import vampire_jax as vj
      run = vj.load_run({str(workdir)!r})
      x = np.random.default_rng(0).random((10, 28, 28, 1), dtype=np.float32)
      probs = run.predict(x[:5], np.arange(5), x, jax.random.key(0))
      print(json.dumps({{"shape": list(probs.shape), "sums": np.asarray(probs.sum(1)).tolist(),
                        "config": type(run.config).__name__, "ways": run.config.ways,
                        "log_std_init": str(type(run.config.algorithm.log_std_init)),
                        "tensorflow": "tensorflow" in sys.modules}}))
  """)
  out = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
  )
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["shape"] == [10, 5] and np.allclose(result["sums"], 1.0, atol=1e-5)
  assert result["config"] == "OmniglotConfig" and result["ways"] == 5
  assert result["log_std_init"] == "<class 'tuple'>" and not result["tensorflow"]


@needs_omniglot
def test_predict_matches_the_runs_own_test_evaluation(tiny_omniglot_run, omniglot_cache):
  workdir, config, results = tiny_omniglot_run
  run = vj.load_run(workdir)
  assert isinstance(run.config, OmniglotConfig) and run.config == config
  # Test task 4 as the run scored it: its sampling and prediction keys come
  # from the test key and the index alone.
  problem = omniglot.make_problem(config, print_fn=lambda message: None)
  test_key = jax.random.split(jax.random.key(config.seed), 4)[3]
  sample_keys, predict_keys = evaluation.index_keys(test_key, jnp.arange(6, dtype=jnp.uint32))
  task = jax.tree_util.tree_map(
    lambda x: x[4], problem.sample_tasks(problem.splits["test"], sample_keys)
  )
  probs = run.predict(task.support_x, task.support_y, task.query_x, predict_keys[4])
  saved = np.load(workdir / "test_per_task.npz")
  np.testing.assert_allclose(probs, saved["probabilities"][4], atol=2e-5)
  np.testing.assert_array_equal(saved["targets"][4], task.query_y)
  # Bad input is refused with the shape the run expects.
  with pytest.raises(ValueError, match=r"\[n, 28, 28, 1\]"):
    run.predict(task.support_x[..., 0], task.support_y, task.query_x, predict_keys[4])
  with pytest.raises(ValueError, match=r"covering every class 0..4"):
    run.predict(task.support_x, task.support_y + 5, task.query_x, predict_keys[4])


def test_load_run_of_a_folder_without_a_run_says_so(tmp_path):
  with pytest.raises(FileNotFoundError, match="run.json"):
    vj.load_run(tmp_path)


@needs_omniglot
def test_preprocess_omniglot_is_what_training_saw(omniglot_cache):
  member = "images_background/Alphabet_of_the_Magi/character01/0709_01.png"
  with zipfile.ZipFile(OMNIGLOT_DIR / "images_background.zip") as archive:
    png = Image.open(io.BytesIO(archive.read(member)))
    drawing = np.asarray(png.convert("L"))  # uint8, strokes dark
  out = vj.data.preprocess_omniglot(drawing[None])
  assert out.shape == (1, 28, 28, 1) and out.dtype == np.float32
  cached = vj.data.load_omniglot(
    cache_dir=omniglot_cache, source="cache", print_fn=lambda message: None
  )
  # Character 0, drawing 0 of the cache (drawer 01), scaled as the task sampler scales it.
  np.testing.assert_array_equal(out[0, ..., 0], vj.data.to_unit_range(cached.images[0, 0]))
  with pytest.raises(ValueError, match="105, 105"):
    vj.data.preprocess_omniglot(np.zeros((2, 28, 28), np.uint8))


def test_scores_do_not_depend_on_the_evaluation_batch():
  model = vj.MLP((8,), 1)
  learner = vj.vampire(
    vj.pure_apply(model), vj.gaussian_nll(0.3), num_inner_steps=2, num_mc_train=2, num_mc_query=3
  )
  meta_params = learner.init(vj.init_params(model, jax.random.key(0), (1, 1)), jax.random.key(1))
  from experiments import regression

  problem = regression.make_problem(regression.get_config("quick"))
  evaluate = jax.jit(vj.make_regression_evaluator(learner, 0.3))
  split = programs.split_evaluator(problem, evaluate, "test")
  key = jax.random.key(5)
  results = [evaluate_split(split, meta_params, key, 10, batch) for batch in (3, 4, 10)]
  for other in results[1:]:
    for name in ("mse", "nll", "predictions", "truth"):
      np.testing.assert_allclose(other[name], results[0][name], rtol=1e-5, atol=1e-6)
  # Another evaluation key scores other tasks.
  assert not np.allclose(
    evaluate_split(split, meta_params, jax.random.key(6), 10, 10)["mse"], results[0]["mse"]
  )
