"""Tests for vampire_jax.data.omniglot: loading, caching and splits.

Tests that read the data look in `$OMNIGLOT_DIR`, else in
`<repo>/../shared/data/omniglot`, and are skipped if the zips are not there.
The full set is built once per session (PIL from the zips, about 6 s). The
full TFDS offline build (about 45 s) is marked `slow` (deselect it with
`-m "not slow"`); TFDS's builder cannot be run on the small zips alone.
"""

import json
import logging
from pathlib import Path

import jax
import numpy as np
import pytest

import vampire_jax as vj
from tests.conftest import (
  OMNIGLOT_DIR,
  needs_omniglot,
)
from tests.helpers import BIG_ZIPS, DATA_DIR, SMALL_ZIPS, needs_data, needs_small_zips
from vampire_jax import data
from vampire_jax.data import (
  ALPHABETS,
  BACKGROUND_ALPHABETS,
  EVALUATION_ALPHABETS,
  OmniglotArrays,
  character_names,
  default_cache_dir,
  load_omniglot,
  make_split,
  omniglot,
  save_split_indices,
  split_indices,
)
from vampire_jax.runs import experiment_configs

# Characters per alphabet, from the data folder's README.
ALPHABET_SIZES = {
  "Alphabet_of_the_Magi": 20,
  "Anglo-Saxon_Futhorc": 29,
  "Arcadian": 26,
  "Armenian": 41,
  "Asomtavruli_(Georgian)": 40,
  "Balinese": 24,
  "Bengali": 46,
  "Blackfoot_(Canadian_Aboriginal_Syllabics)": 14,
  "Braille": 26,
  "Burmese_(Myanmar)": 34,
  "Cyrillic": 33,
  "Early_Aramaic": 22,
  "Futurama": 26,
  "Grantha": 43,
  "Greek": 24,
  "Gujarati": 48,
  "Hebrew": 22,
  "Inuktitut_(Canadian_Aboriginal_Syllabics)": 16,
  "Japanese_(hiragana)": 52,
  "Japanese_(katakana)": 47,
  "Korean": 40,
  "Latin": 26,
  "Malay_(Jawi_-_Arabic)": 40,
  "Mkhedruli_(Georgian)": 41,
  "N_Ko": 33,
  "Ojibwe_(Canadian_Aboriginal_Syllabics)": 14,
  "Sanskrit": 42,
  "Syriac_(Estrangelo)": 23,
  "Tagalog": 17,
  "Tifinagh": 55,
  "Angelic": 20,
  "Atemayar_Qelisayer": 26,
  "Atlantean": 26,
  "Aurek-Besh": 26,
  "Avesta": 26,
  "Ge_ez": 26,
  "Glagolitic": 45,
  "Gurmukhi": 45,
  "Kannada": 41,
  "Keble": 26,
  "Malayalam": 47,
  "Manipuri": 40,
  "Mongolian": 30,
  "Old_Church_Slavonic_(Cyrillic)": 45,
  "Oriya": 46,
  "Sylheti": 28,
  "Syriac_(Serto)": 23,
  "Tengwar": 25,
  "Tibetan": 42,
  "ULOG": 26,
}


ORIGINAL_VAL_ALPHABETS = [
  "Ojibwe_(Canadian_Aboriginal_Syllabics)",
  "Sanskrit",
  "Syriac_(Estrangelo)",
  "Tagalog",
  "Tifinagh",
]


def _fake_arrays():
  """Omniglot's layout with tiny images holding each row's index."""
  alphabet = np.repeat(np.arange(50, dtype=np.int32), [ALPHABET_SIZES[a] for a in ALPHABETS])
  return OmniglotArrays(
    images=np.arange(len(alphabet))[:, None], alphabet=alphabet, is_background=alphabet < 30
  )


@pytest.fixture
def small_folder(tmp_path):
  """A folder laid out like the data folder, the big zips being the small."""
  folder = tmp_path / "small"
  folder.mkdir()
  for name, target in zip(BIG_ZIPS + SMALL_ZIPS, SMALL_ZIPS + SMALL_ZIPS):
    (folder / name).symlink_to(DATA_DIR / target)
  return folder


def _assert_partition(parts, num_characters):
  """Train, val and test are disjoint, sorted, and cover every character."""
  everything = np.concatenate(list(parts.values()))
  assert len(everything) == len(set(everything.tolist())) == num_characters
  for idx in parts.values():
    assert np.all(np.diff(idx) > 0)


@needs_omniglot
def test_omniglot_without_held_out_alphabets_trains_on_all_964(omniglot_cache):
  arrays = data.load_omniglot(cache_dir=omniglot_cache, source="cache")
  background = np.flatnonzero(arrays.is_background)
  sizes = [int(np.sum(arrays.alphabet[background] == a)) for a in range(30)]
  assert tuple(sizes) == experiment_configs.OMNIGLOT_BACKGROUND_ALPHABET_SIZES
  split = data.split_indices(arrays, "original", num_val_alphabets=0)
  assert len(split["train"]) == 964
  np.testing.assert_array_equal(split["train"], background)
  # Validation never touches the evaluation alphabets, nor does training.
  for part in ("train", "val"):
    assert np.all(arrays.is_background[split[part]])
    assert set(arrays.alphabet[split[part]]) <= set(range(30))
  assert not set(split["test"]) & set(split["val"])
  default = data.split_indices(arrays, "original")
  assert (len(default["train"]), len(default["val"])) == (813, 151)
  random = data.split_indices(arrays, "random", num_val_characters=0)
  assert len(random["train"]) == 1200 and not set(random["test"]) & set(random["val"])


@needs_data
def test_counts_and_order(arrays):
  assert arrays.images.shape == (1623, 20, 28, 28)
  assert arrays.images.dtype == np.uint8
  assert arrays.alphabet.dtype == np.int32
  assert arrays.is_background.dtype == bool
  # Background first, then evaluation; alphabets in sorted order, in blocks.
  np.testing.assert_array_equal(arrays.is_background, np.arange(1623) < 964)
  assert np.all(np.diff(arrays.alphabet) >= 0)
  assert list(BACKGROUND_ALPHABETS) == sorted(BACKGROUND_ALPHABETS)
  assert list(EVALUATION_ALPHABETS) == sorted(EVALUATION_ALPHABETS)
  sizes = np.bincount(arrays.alphabet, minlength=50)
  assert dict(zip(ALPHABETS, sizes.tolist())) == ALPHABET_SIZES
  names = character_names(arrays)
  assert names[0] == "Alphabet_of_the_Magi/character01"
  assert names[963] == "Tifinagh/character55"
  assert names[964] == "Angelic/character01"
  assert names[-1] == "ULOG/character26"


@needs_data
def test_cache_is_written_and_read(arrays, cache_dir, monkeypatch):
  path = cache_dir / "omniglot28.npz"
  assert 24e6 < path.stat().st_size < 27e6
  monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
  for source in ("cache", "auto"):  # 'auto' needs no folder when cached.
    cached = load_omniglot(cache_dir=cache_dir, source=source)
    for field in ("images", "alphabet", "is_background"):
      np.testing.assert_array_equal(getattr(cached, field), getattr(arrays, field))
    # The cache remembers what it was built from.
    assert cached.provenance["source"] == "zip" and cached.provenance["loaded"] == "cache"
    assert cached.provenance["folder"] == str(DATA_DIR.resolve())
  assert arrays.provenance["loaded"] == "built"
  # The same folder again: the cache is current, nothing is rebuilt.
  again = load_omniglot(DATA_DIR, cache_dir=cache_dir)
  assert again.provenance["loaded"] == "cache"


@needs_data
def test_data_folder_is_not_written(arrays, data_listing):
  del arrays  # Built by now.
  after = sorted((p.name, p.stat().st_mtime) for p in DATA_DIR.iterdir())
  assert after == data_listing


def test_cache_dir_inside_data_folder_is_refused(tmp_path):
  with pytest.raises(ValueError, match="inside the data folder"):
    load_omniglot(tmp_path, cache_dir=tmp_path / "cache", source="zip")


@needs_data
def test_split_images_on_real_data(arrays):
  for split, sizes in (("original", (813, 151, 659)), ("random", (1100, 100, 423))):
    parts = make_split(arrays, split)
    assert [len(parts[p]) for p in ("train", "val", "test")] == list(sizes)
    indices = split_indices(arrays, split)
    for part, images in parts.items():
      assert images.shape[1:] == (20, 28, 28) and images.dtype == np.uint8
      np.testing.assert_array_equal(images, arrays.images[indices[part]])


def test_missing_folder_error_is_helpful(tmp_path):
  missing = tmp_path / "no_such_dir"
  for source in ("auto", "zip", "tfds"):
    with pytest.raises(FileNotFoundError) as error:
      load_omniglot(missing, cache_dir=tmp_path / "cache", source=source)
    message = str(error.value)
    assert str(missing) in message and "does not exist" in message
    for expected in (
      "images_background.zip",
      "images_evaluation.zip",
      "github.com/brendenlake/omniglot",
      "OMNIGLOT_DIR",
    ):
      assert expected in message


def test_environment_variables(tmp_path, monkeypatch):
  monkeypatch.setenv("OMNIGLOT_DIR", str(tmp_path / "from_env"))
  with pytest.raises(FileNotFoundError, match="from_env"):
    load_omniglot(cache_dir=tmp_path / "cache")
  monkeypatch.setenv("VAMPIRE_JAX_CACHE", str(tmp_path / "cache_env"))
  assert default_cache_dir() == tmp_path / "cache_env"
  monkeypatch.delenv("VAMPIRE_JAX_CACHE")
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # which would win over ~/.cache
  assert default_cache_dir() == Path.home() / ".cache" / "vampire_jax"


def test_incomplete_folder_errors(tmp_path):
  folder = tmp_path / "data"
  folder.mkdir()
  (folder / "images_background.zip").write_bytes(b"")
  with pytest.raises(FileNotFoundError) as error:
    load_omniglot(folder, cache_dir=tmp_path / "cache", source="zip")
  assert "images_evaluation.zip not found" in str(error.value)
  assert "github.com/brendenlake/omniglot" in str(error.value)
  (folder / "images_evaluation.zip").write_bytes(b"")
  pytest.importorskip("tensorflow")
  with pytest.raises(FileNotFoundError, match="small1"):
    load_omniglot(folder, cache_dir=tmp_path / "cache", source="tfds")


def test_a_named_empty_folder_is_an_error_even_with_a_cache(tmp_path):
  cache = tmp_path / "cache"
  fake = _fake_arrays()
  omniglot._write_cache(
    cache / "omniglot28.npz", fake, {"source": "zip", "folder": "/elsewhere", "fingerprint": None}
  )
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="not found in the Omniglot folder"):
    load_omniglot(empty, cache_dir=cache)


def test_folder_with_a_zip_means_the_zip_reader(tmp_path, monkeypatch):
  # TFDS stays the path without a folder; with one, the zips are read directly,
  # even when TFDS and the four zips TFDS needs are there.
  for name in BIG_ZIPS + SMALL_ZIPS:
    (tmp_path / name).write_bytes(b"")
  calls = []

  def fake(name):
    def load(*args):
      calls.append(name)
      raise RuntimeError("stop here")

    return load

  monkeypatch.setattr(omniglot, "_load_zips", fake("zip"))
  monkeypatch.setattr(omniglot, "_load_tfds", fake("tfds"))
  for data_dir, expected in ((tmp_path, "zip"), (None, "tfds")):
    monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
    with pytest.raises(RuntimeError, match="stop here"):
      load_omniglot(data_dir, cache_dir=tmp_path.parent / "cache_auto")
    assert calls[-1] == expected


def test_a_cache_of_other_data_is_rebuilt_from_the_named_folder(tmp_path, monkeypatch):
  folder = tmp_path / "data"
  folder.mkdir()
  for name in BIG_ZIPS:
    (folder / name).write_bytes(b"new data")
  cache = tmp_path / "cache"
  omniglot._write_cache(
    cache / "omniglot28.npz",
    _fake_arrays(),
    {"source": "zip", "folder": "/elsewhere", "fingerprint": [["old"]]},
  )
  monkeypatch.setattr(omniglot, "_validate", lambda arrays: None)  # the fake is not 28x28
  rebuilt = []
  monkeypatch.setattr(omniglot, "_load_zips", lambda f: rebuilt.append(f) or _fake_arrays())
  messages = []
  result = load_omniglot(folder, cache_dir=cache, print_fn=messages.append)
  assert rebuilt == [folder] and result.provenance["loaded"] == "built"
  assert any("was not built from the zips in" in m for m in messages)
  # Now the cache is of this folder: read, not rebuilt.
  assert load_omniglot(folder, cache_dir=cache).provenance["loaded"] == "cache"
  assert rebuilt == [folder]


def test_missing_cache_and_bad_source(tmp_path):
  with pytest.raises(FileNotFoundError, match="No Omniglot cache"):
    load_omniglot(cache_dir=tmp_path, source="cache")
  with pytest.raises(ValueError, match="source must be one of"):
    load_omniglot(tmp_path, cache_dir=tmp_path, source="torch")


@needs_data
@needs_small_zips
def test_partial_set_fails_validation(small_folder, tmp_path):
  # The small zips hold 136 + 156 characters, not 964 + 659.
  with pytest.raises(ValueError, match="Not the full Omniglot set"):
    load_omniglot(small_folder, cache_dir=tmp_path / "cache", source="zip")
  assert not (tmp_path / "cache" / "omniglot28.npz").exists()


def test_original_split():
  fake = _fake_arrays()
  parts = split_indices(fake, "original", seed=123)
  assert [len(parts[p]) for p in ("train", "val", "test")] == [813, 151, 659]
  _assert_partition(parts, 1623)
  val_alphabets = sorted({ALPHABETS[a] for a in fake.alphabet[parts["val"]]})
  assert val_alphabets == ORIGINAL_VAL_ALPHABETS
  np.testing.assert_array_equal(np.sort(np.r_[parts["train"], parts["val"]]), np.arange(964))
  np.testing.assert_array_equal(parts["test"], np.arange(964, 1623))
  # Whole alphabets: no alphabet in two parts. The seed is not used.
  alphabets = [set(fake.alphabet[parts[p]].tolist()) for p in parts]
  assert not (
    alphabets[0] & alphabets[1] or alphabets[0] & alphabets[2] or alphabets[1] & alphabets[2]
  )
  one_val = split_indices(fake, "original", num_val_alphabets=1)
  assert [len(one_val[p]) for p in ("train", "val")] == [909, 55]  # Tifinagh.
  # No held-out alphabet: all 964 train, and validation draws its tasks from them.
  no_val = split_indices(fake, "original", num_val_alphabets=0)
  assert [len(no_val[p]) for p in ("train", "val")] == [964, 964]
  np.testing.assert_array_equal(no_val["val"], no_val["train"])


def test_random_split():
  fake = _fake_arrays()
  parts = split_indices(fake, "random", seed=0)
  assert [len(parts[p]) for p in ("train", "val", "test")] == [1100, 100, 423]
  _assert_partition(parts, 1623)
  again = split_indices(fake, "random", seed=0)
  other = split_indices(fake, "random", seed=1)
  for part in parts:
    np.testing.assert_array_equal(parts[part], again[part])
  assert not np.array_equal(parts["test"], other["test"])
  # Characters from both sets in every part.
  assert 0 < np.sum(fake.is_background[parts["test"]]) < 423
  bigger_val = split_indices(fake, "random", num_val_characters=200)
  assert [len(bigger_val[p]) for p in ("train", "val", "test")] == [1000, 200, 423]
  np.testing.assert_array_equal(bigger_val["test"], parts["test"])


def test_make_split_takes_rows():
  fake = _fake_arrays()
  images = make_split(fake, "random", seed=3)
  parts = split_indices(fake, "random", seed=3)
  for part in parts:
    np.testing.assert_array_equal(images[part][:, 0], parts[part])


def test_save_split_indices(tmp_path):
  fake = _fake_arrays()
  path = tmp_path / "splits" / "original.json"
  parts = save_split_indices(path, fake, "original")
  record = json.loads(path.read_text())
  assert record["split"] == "original"
  for part in ("train", "val", "test"):
    assert record[part]["indices"] == parts[part].tolist()
    assert record[part]["num_characters"] == len(parts[part])
  assert record["val"]["alphabets"] == ORIGINAL_VAL_ALPHABETS
  assert record["val"]["characters"][-1] == "Tifinagh/character55"
  assert record["test"]["characters"][0] == "Angelic/character01"
  random_record = save_split_indices(tmp_path / "r.json", fake, "random", seed=7)
  assert json.loads((tmp_path / "r.json").read_text())["seed"] == 7
  assert len(random_record["test"]) == 423


def test_split_errors():
  fake = _fake_arrays()
  with pytest.raises(ValueError, match="split must be one of"):
    split_indices(fake, "vinyals")
  with pytest.raises(ValueError, match="num_val_characters"):
    split_indices(fake, "random", num_val_characters=1200)
  with pytest.raises(ValueError, match="num_val_alphabets"):
    split_indices(fake, "original", num_val_alphabets=30)


def test_load_omniglot_logs_its_progress_and_prints_nothing_unless_told(
  tmp_path, monkeypatch, caplog, capsys
):
  """load_omniglot logs its progress (the `vampire_jax.data.omniglot` logger, INFO) and
  prints nothing; `print_fn` sends the lines elsewhere (the experiments pass `print`)."""
  folder = tmp_path / "data"
  folder.mkdir()
  for name in BIG_ZIPS:
    (folder / name).write_bytes(b"data")
  monkeypatch.setattr(omniglot, "_validate", lambda arrays: None)  # the fake is not 28x28
  monkeypatch.setattr(omniglot, "_load_zips", lambda f: _fake_arrays())
  with caplog.at_level(logging.INFO, logger="vampire_jax.data.omniglot"):
    load_omniglot(folder, cache_dir=tmp_path / "cache")
  assert capsys.readouterr() == ("", "")
  logged = [r.getMessage() for r in caplog.records if r.name == "vampire_jax.data.omniglot"]
  assert logged[0].startswith("Omniglot: building 28x28 arrays from the zips in ")
  assert logged[-1].startswith("Omniglot: built in ")
  lines = []
  load_omniglot(folder, cache_dir=tmp_path / "cache", print_fn=lines.append)
  assert lines == [line for line in lines if line.startswith("Omniglot: cached arrays ")] != []


@needs_omniglot
def test_a_truncated_omniglot_cache_is_rebuilt_from_the_zips(omniglot_cache, tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  data = (omniglot_cache / "omniglot28.npz").read_bytes()
  (cache / "omniglot28.npz").write_bytes(data[: len(data) // 2])
  lines = []
  arrays = vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, print_fn=lines.append)
  assert any(
    "rebuilding the cache" in line and "omniglot28.npz is damaged" in line for line in lines
  ), lines
  assert arrays.provenance["loaded"] == "built" and arrays.images.shape[0] == 1623
  rebuilt = vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="cache")
  np.testing.assert_array_equal(rebuilt.images, arrays.images)
  with pytest.raises(vj.DataError, match="omniglot28.npz is damaged"):  # only the cache: refused
    (cache / "omniglot28.npz").write_bytes(data[:1000])
    vj.data.load_omniglot(OMNIGLOT_DIR, cache_dir=cache, source="cache")


def test_an_omniglot_dir_that_is_a_file_says_so(tmp_path):
  (tmp_path / "zips").write_text("")
  with pytest.raises(vj.MissingDataError, match=r"Omniglot folder .*zips is a file, not a folder"):
    vj.data.load_omniglot(tmp_path / "zips", cache_dir=tmp_path / "cache")


def test_the_caches_honour_xdg_cache_home_unless_vampire_jax_cache_is_set(tmp_path, monkeypatch):
  """The data cache and the XLA cache go under an absolute XDG_CACHE_HOME, under
  VAMPIRE_JAX_CACHE where set, and under ~/.cache otherwise."""
  from experiments import cli
  from vampire_jax.data import default_cache_dir

  monkeypatch.delenv("VAMPIRE_JAX_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert default_cache_dir() == tmp_path / "xdg" / "vampire_jax"
  assert cli.compilation_cache_dir() == tmp_path / "xdg" / "vampire_jax" / "xla"
  before = jax.config.jax_compilation_cache_dir
  try:  # the command lines' XLA cache goes there
    cli.enable_compilation_cache_or_say_why_not()
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xdg" / "vampire_jax" / "xla")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
  # Ours wins over XDG's; a relative XDG_CACHE_HOME is ignored, as the XDG spec asks.
  monkeypatch.setenv("VAMPIRE_JAX_CACHE", str(tmp_path / "ours"))
  assert default_cache_dir() == tmp_path / "ours"
  assert cli.compilation_cache_dir() == tmp_path / "ours" / "xla"
  monkeypatch.delenv("VAMPIRE_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
  assert default_cache_dir() == Path.home() / ".cache" / "vampire_jax"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert default_cache_dir() == Path.home() / ".cache" / "vampire_jax"


def test_load_omniglot_reads_its_cache_under_xdg_cache_home(tmp_path, monkeypatch, omniglot_cache):
  """load_omniglot reads its cached arrays from XDG_CACHE_HOME's folder, not ~/.cache."""
  import shutil

  from tests.conftest import OMNIGLOT_DIR
  from vampire_jax.data import load_omniglot
  from vampire_jax.data.omniglot import CACHE_FILENAME

  xdg_cache = tmp_path / "xdg" / "vampire_jax"
  xdg_cache.mkdir(parents=True)
  shutil.copy(omniglot_cache / CACHE_FILENAME, xdg_cache / CACHE_FILENAME)
  monkeypatch.delenv("VAMPIRE_JAX_CACHE", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty ~/.cache: only XDG's holds it
  arrays = load_omniglot(OMNIGLOT_DIR, print_fn=lambda message: None)
  assert arrays.provenance["loaded"] == "cache"  # read from XDG's folder, not built again
  assert not (tmp_path / "home").exists()
  assert arrays.images.shape[1:] == (20, 28, 28)
