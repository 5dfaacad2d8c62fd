"""`orbax.checkpoint`, imported when a checkpoint is first read or written.

Its import holds about 29 MB of resident memory, which a process that only steps (a user's
own loop over `vj.adapt`, a benchmark) never needs: `import vampire_jax` leaves it out, and
`ocp.<name>` imports it on first use.
"""


class _OrbaxCheckpoint:
  """Stands for the module `orbax.checkpoint`; each attribute is the module's own."""

  def __getattr__(self, name: str):
    import orbax.checkpoint

    return getattr(orbax.checkpoint, name)


ocp = _OrbaxCheckpoint()
