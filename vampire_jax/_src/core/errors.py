"""Errors that mean "the input is wrong", as opposed to a bug.

The command lines print a `UserError` as one line naming the offending flag,
file or folder, without a traceback, and exit with code 2. Each class also
derives from the built-in error a caller would expect (`ValueError`,
`FileNotFoundError`), so `except ValueError` keeps working.
"""


class UserError(Exception):
  """Bad input: a setting, a file or a folder the user can fix.

  `UserError(message, fields=("tasks_per_step",))`: `fields` names the settings (config
  fields, arguments of `vj.train_and_evaluate`) the message is about, by their names, so
  that a command line can say its own flags instead.
  """

  def __init__(self, *args, fields: tuple[str, ...] = ()):
    super().__init__(*args)
    self.fields = tuple(fields)


class ConfigError(UserError, ValueError):
  """A setting is impossible (a negative count, a NaN rate, too many ways...)."""


class DataError(UserError, ValueError):
  """A data file is corrupt or incomplete, or does not match its cache."""


class DivergenceError(ConfigError, FloatingPointError):
  """The settings make training non-finite from the start (e.g. the inner loop at initialisation).

  A `ConfigError` (the command lines print one line, exit 2) and a
  `FloatingPointError` (a comparison records the method as diverged).
  """


class MissingDataError(UserError, FileNotFoundError):
  """A data folder or file is missing; the message says how to get it."""


class InputError(UserError, ValueError):
  """An argument's shape, dtype or values cannot be what the function needs.

  The message names the function and the argument, what it wants and what it got.
  """


class RunFolderError(UserError):
  """A run folder cannot be used: another process holds it, or nothing in it restores."""


class StorageError(UserError, OSError):
  """A file cannot be written: a full disk, a read-only folder, a file where a folder should be.

  `StorageError(errno, message)`; `str()` is the one-line message.
  """

  def __str__(self) -> str:
    return self.strerror or super().__str__()
