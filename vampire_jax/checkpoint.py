"""A run folder's checkpoints: kept under this name; they live in `vampire_jax.run_folder`.

checkpoints/     the full `MetaState` of the last two saves (resumed from)
best/            the meta-parameters with the best validation score
best_score.json  {"step", "score", "metric"} of `best/`
train_time.json  training seconds up to each saved step, summed over resumes
"""

from vampire_jax.run_folder import RunCheckpoints

__all__ = ["RunCheckpoints"]
