"""Tests for vampire_jax.data.omniglot: loading, caching and splits.

Tests that read the data look in `$OMNIGLOT_DIR`, else in
`<repo>/../shared/data/omniglot`, and are skipped if the zips are not there.
The full set is built once per session (PIL from the zips, about 6 s). The
full TFDS offline build (about 45 s) is marked `slow` (deselect it with
`-m "not slow"`); TFDS's builder cannot be run on the small zips alone.
"""

import logging
import importlib.util
import io
import json
import os
from pathlib import Path
import zipfile

import numpy as np
from PIL import Image
import pytest

from vampire_jax.data import ALPHABETS
from vampire_jax.data import BACKGROUND_ALPHABETS
from vampire_jax.data import EVALUATION_ALPHABETS
from vampire_jax.data import character_names
from vampire_jax.data import default_cache_dir
from vampire_jax.data import load_omniglot
from vampire_jax.data import make_split
from vampire_jax.data import OmniglotArrays
from vampire_jax.data import save_split_indices
from vampire_jax.data import split_indices
from vampire_jax.data import omniglot
from vampire_jax.data import omniglot_tfds
from vampire_jax._src.core.errors import DataError

DATA_DIR = Path(
  os.environ.get("OMNIGLOT_DIR") or Path(__file__).resolve().parents[2] / "shared/data/omniglot"
)
BIG_ZIPS = ("images_background.zip", "images_evaluation.zip")
SMALL_ZIPS = ("images_background_small1.zip", "images_background_small2.zip")
needs_data = pytest.mark.skipif(
  not all((DATA_DIR / f).is_file() for f in BIG_ZIPS),
  reason=f"Omniglot zips not found in {DATA_DIR} (set OMNIGLOT_DIR).",
)
needs_small_zips = pytest.mark.skipif(
  not all((DATA_DIR / f).is_file() for f in SMALL_ZIPS),
  reason=f"Omniglot small zips not found in {DATA_DIR}.",
)

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


def _per_character_multisets(images):
  """[C, 20, 28, 28] -> each character's drawings in a canonical order."""
  flat = images.reshape(images.shape[0], images.shape[1], -1)
  return np.stack([np.stack(sorted(c, key=bytes)) for c in flat])


def _reference_image(zip_name, member):
  """One drawing decoded and resized independently of the loader."""
  with zipfile.ZipFile(DATA_DIR / zip_name) as archive:
    image = Image.open(io.BytesIO(archive.read(member)))
    gray = np.asarray(image.convert("L"))
  small = Image.fromarray(gray).resize((28, 28), Image.Resampling.LANCZOS)
  return gray, 255 - np.asarray(small)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("omniglot_cache")


@pytest.fixture(scope="session")
def data_listing():
  if not DATA_DIR.is_dir():
    pytest.skip(f"No Omniglot folder {DATA_DIR} (set OMNIGLOT_DIR).")
  return sorted((p.name, p.stat().st_mtime) for p in DATA_DIR.iterdir())


@pytest.fixture(scope="session")
def arrays(cache_dir, data_listing):
  del data_listing  # Taken before the build.
  if not all((DATA_DIR / f).is_file() for f in BIG_ZIPS):
    pytest.skip(f"Omniglot zips not found in {DATA_DIR} (set OMNIGLOT_DIR).")
  return load_omniglot(DATA_DIR, cache_dir=cache_dir, source="zip")


@pytest.fixture
def small_folder(tmp_path):
  """A folder laid out like the data folder, the big zips being the small."""
  folder = tmp_path / "small"
  folder.mkdir()
  for name, target in zip(BIG_ZIPS + SMALL_ZIPS, SMALL_ZIPS + SMALL_ZIPS):
    (folder / name).symlink_to(DATA_DIR / target)
  return folder


# Loading the full set.


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
def test_pixels_are_inverted_and_resized(arrays):
  images = arrays.images
  assert images.min() == 0 and images.max() == 255
  # Strokes bright on black: most pixels are 0, the border is nearly empty.
  assert np.mean(images == 0) > 0.6
  assert np.mean(images[:, :, 0, :]) < 5 and np.mean(images[:, :, :, 0]) < 5
  # Ink is conserved by the resize (within 10%): ink in the 105x105 PNGs.
  gray, expected = _reference_image(
    "images_background.zip", "images_background/Alphabet_of_the_Magi/character01/0709_01.png"
  )
  np.testing.assert_array_equal(images[0, 0], expected)
  ink_105 = np.mean(gray == 0)
  assert abs(np.mean(images[0, 0]) / 255 - ink_105) < 0.1 * ink_105
  # Last drawing of the last character, the evaluation set's drawer 20.
  _, expected = _reference_image(
    "images_evaluation.zip", "images_evaluation/ULOG/character26/1623_20.png"
  )
  np.testing.assert_array_equal(images[-1, -1], expected)
  # Drawings of one character differ from each other.
  assert len({d.tobytes() for d in images[0]}) == 20


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


# Errors.


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


def test_truncated_zip_is_an_error_that_names_the_file(tmp_path):
  folder = tmp_path / "data"
  folder.mkdir()
  for name in BIG_ZIPS:
    (folder / name).write_bytes(b"PK\x03\x04 truncated")
  with pytest.raises(DataError) as error:
    load_omniglot(folder, cache_dir=tmp_path / "cache")
  assert "images_background.zip" in str(error.value) and "truncated" in str(error.value)
  assert not (tmp_path / "cache" / "omniglot28.npz").exists()


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


def test_a_failed_tfds_build_leaves_no_files(tmp_path, monkeypatch):
  pytest.importorskip("tensorflow")

  def failing(tfds, folder, tfds_dir):
    (tfds_dir / "downloads").mkdir(parents=True)
    (tfds_dir / "downloads" / "partial.zip").write_bytes(b"x" * 1000)
    raise OSError("the download broke off")

  monkeypatch.setattr(omniglot_tfds, "_prepare_tfds", failing)
  monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
  with pytest.raises(DataError, match="the download broke off"):
    load_omniglot(cache_dir=tmp_path / "cache", source="tfds")
  assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_tfds_without_tensorflow_says_what_to_install(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a)
  )
  monkeypatch.delenv("OMNIGLOT_DIR", raising=False)
  with pytest.raises(FileNotFoundError, match=r'pip install -e "\.\[data\]"'):
    load_omniglot(cache_dir=tmp_path / "cache", source="auto")


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


@needs_data
@needs_small_zips
def test_extracted_folders_read_like_zips(small_folder, tmp_path):
  extracted = tmp_path / "extracted"
  extracted.mkdir()
  for zip_name, set_name in zip(SMALL_ZIPS, ("images_background", "images_evaluation")):
    with zipfile.ZipFile(DATA_DIR / zip_name) as archive:
      archive.extractall(tmp_path)
    # The small zips' top folders are images_background_small1 and 2.
    (tmp_path / zip_name.removesuffix(".zip")).rename(extracted / set_name)
  from_zips = omniglot._load_zips(small_folder)
  from_folders = omniglot._load_zips(extracted)
  assert from_zips.images.shape == (136 + 156, 20, 28, 28)
  for a, b in zip(from_zips, from_folders):
    np.testing.assert_array_equal(a, b)


# TFDS.


@needs_data
@needs_small_zips
def test_tfds_checksums_are_replaced_then_restored():
  tfds = pytest.importorskip("tensorflow_datasets")
  builder_cls = tfds.builder_cls("omniglot")
  url = "https://github.com/brendenlake/omniglot/raw/master/python/"
  registered = dict(builder_cls.url_infos)
  assert registered[url + "images_background.zip"].checksum.startswith("ad41ab")
  with omniglot_tfds._local_checksums(tfds, DATA_DIR):
    # The digests of the rebuilt zips, from the data folder's README.
    local = builder_cls.url_infos
    assert local[url + "images_background.zip"].checksum.startswith("512b4a")
    assert local[url + "images_evaluation.zip"].checksum.startswith("98893e")
    assert (
      local[url + "images_background_small1.zip"]
      == registered[url + "images_background_small1.zip"]
    )
  assert dict(builder_cls.url_infos) == registered


@pytest.mark.slow
@needs_data
@needs_small_zips
def test_tfds_offline_full_build_matches_zip_reader(arrays, tmp_path):
  # The stock builder needs all 50 alphabets, so no smaller TFDS build works.
  tfds = pytest.importorskip("tensorflow_datasets")
  registered = dict(tfds.builder_cls("omniglot").url_infos)
  from_tfds = load_omniglot(DATA_DIR, cache_dir=tmp_path, source="tfds")
  assert dict(tfds.builder_cls("omniglot").url_infos) == registered
  np.testing.assert_array_equal(from_tfds.alphabet, arrays.alphabet)
  np.testing.assert_array_equal(from_tfds.is_background, arrays.is_background)
  np.testing.assert_array_equal(
    _per_character_multisets(from_tfds.images), _per_character_multisets(arrays.images)
  )
  assert (tmp_path / "omniglot28.npz").is_file()


# Splits (on a fake with Omniglot's layout, so they run without the data).


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


def _assert_partition(parts, num_characters):
  """Train, val and test are disjoint, sorted, and cover every character."""
  everything = np.concatenate(list(parts.values()))
  assert len(everything) == len(set(everything.tolist())) == num_characters
  for idx in parts.values():
    assert np.all(np.diff(idx) > 0)


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
