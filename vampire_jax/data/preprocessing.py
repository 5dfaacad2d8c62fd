"""Images prepared the way the networks were trained on them.

`preprocess_omniglot` and `preprocess_mini_imagenet` take raw images (as
read from the data sets' files, or from anywhere else) and return what a
trained network expects as `support_x` / `query_x`. The data loaders use
the same per-image functions (`omniglot_drawing_to_28`, `resize_to_84`) to
build their caches, and the task sampler scales the cached uint8 arrays to
[0, 1] as these functions do.
"""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  from PIL import Image

OMNIGLOT_SIZE = 28
OMNIGLOT_ORIGINAL_SIZE = 105
MINI_IMAGENET_SIZE = 84


def pil_image():
  """PIL's `Image` module, imported when first needed.

  Pillow is a dependency of the library (for these functions and the data
  loaders), imported here so that `import vampire_jax` and loading a
  trained run do not load it.

  Raises:
    ImportError: Pillow is missing (an install that skipped the
      dependencies); the message says what to install.
  """
  try:
    from PIL import Image
  except ImportError as error:
    raise ImportError(
      "reading and resizing images needs Pillow, a dependency of vampire-jax: pip install pillow"
    ) from error
  return Image


def omniglot_drawing_to_28(image: "Image.Image") -> np.ndarray:
  """One 105x105 drawing, strokes dark -> uint8 `[28, 28]`, strokes 255, background 0.

  Grey conversion, LANCZOS resize, then inversion (as MAML inverts; MAML
  resized the 1-bit image, which PIL does with NEAREST, so edges differ).
  """
  if image.size != (OMNIGLOT_ORIGINAL_SIZE, OMNIGLOT_ORIGINAL_SIZE):
    raise ValueError(f"Expected 105x105 Omniglot drawings, got {image.size[0]}x{image.size[1]}.")
  small = image.convert("L").resize((OMNIGLOT_SIZE, OMNIGLOT_SIZE), pil_image().Resampling.LANCZOS)
  return 255 - np.asarray(small, np.uint8)


def resize_to_84(image: "Image.Image") -> np.ndarray:
  """PIL image -> uint8 `[84, 84, 3]` RGB (LANCZOS if not 84x84 already)."""
  image = image.convert("RGB")
  if image.size != (MINI_IMAGENET_SIZE, MINI_IMAGENET_SIZE):
    image = image.resize((MINI_IMAGENET_SIZE, MINI_IMAGENET_SIZE), pil_image().Resampling.LANCZOS)
  return np.asarray(image, np.uint8)


def preprocess_omniglot(images) -> np.ndarray:
  """Omniglot drawings as the networks were trained on them.

  Args:
    images: uint8 `[n, 105, 105]` drawings, strokes dark on white as in the
      data set's PNGs (booleans, as PIL reads the 1-bit PNGs, also work).

  Returns:
    float32 `[n, 28, 28, 1]` in [0, 1], strokes bright.
  """
  images = np.asarray(images)
  if images.ndim != 3 or images.shape[1:] != (OMNIGLOT_ORIGINAL_SIZE,) * 2:
    raise ValueError(f"images must be [n, 105, 105] Omniglot drawings, got shape {images.shape}")
  if images.dtype == bool:
    images = images.astype(np.uint8) * 255
  if images.dtype != np.uint8:
    raise ValueError(f"images must be uint8 (0 = ink, 255 = paper), got dtype {images.dtype}")
  small = [omniglot_drawing_to_28(pil_image().fromarray(image)) for image in images]
  return (np.stack(small).astype(np.float32) / 255.0)[..., None]


def preprocess_mini_imagenet(images) -> np.ndarray:
  """RGB images of any size -> float32 `[n, 84, 84, 3]` in [0, 1] (LANCZOS resize).

  Args:
    images: uint8 `[n, H, W, 3]`.
  """
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(f"images must be uint8 [n, H, W, 3], got {images.dtype}{images.shape}")
  resized = [resize_to_84(pil_image().fromarray(image)) for image in images]
  return np.stack(resized).astype(np.float32) / 255.0
