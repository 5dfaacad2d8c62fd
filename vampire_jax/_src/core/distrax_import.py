"""distrax, imported on first use and without TensorFlow.

distrax loads TensorFlow Probability's JAX substrate, whose backend tries
`import tensorflow` only to copy TensorFlow's docstrings onto its own
functions (`tensorflow_probability/python/internal/backend/jax/_utils.py`,
in a `try ... except ImportError`). Where TensorFlow is installed (the
`data` extra), that import costs most of distrax's import time (26-32 s
against 10 s on a loaded 2-core CPU) and prints TensorFlow's start-up log
lines (oneDNN, CPU features) on the first `vj.predictive` call. Nothing of
TensorFlow is used, so the import is refused while distrax loads: TFP then
runs without the copied docstrings. A process that imported TensorFlow
itself keeps it, and one that imports it afterwards gets it as usual.
"""

import sys
import threading
import types

_LOCK = threading.Lock()


def import_distrax() -> types.ModuleType:
  """The `distrax` module; the first call imports it without importing TensorFlow."""
  loaded = sys.modules.get("distrax")
  if loaded is not None:
    return loaded
  with _LOCK:
    hide = "tensorflow" not in sys.modules
    if hide:
      sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError meanwhile
    try:
      import distrax
    finally:
      if hide and sys.modules.get("tensorflow", 0) is None:
        del sys.modules["tensorflow"]
  return distrax
