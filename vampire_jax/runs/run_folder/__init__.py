"""The run folder, a small database with one owner: records, lock, checkpoints, logs, results.

    workdir/
      .lock              pid and host of the process that owns the folder (`fcntl.flock`)
      run.json           the run record: config, network, input shape, kind, data, and
                         what the backend's 'auto' choices ran as (`recorded_choices`)
      config.json        the config alone, for people
      checkpoints/<n>/   orbax: the full `MetaState` of the last two saves; each step
                         also carries the run record (with the run's id), its step and
                         the training seconds up to it
      best/<n>/          the meta-parameters with the best validation score, carrying
                         that score's record, the run's id and the step
      best_score.json    {"step", "score", "metric"} of `best/` (a copy of what it carries)
      train_time.json    training seconds up to each saved step (a copy, too)
      metrics.jsonl      one JSON line per logged step, append-only
      results.json, test_per_task.npz

A folder of a zoo (`experiments.zoo`) has its files' sha256 recorded beside it, in the
zoo's `manifest.json`: `load_run` refuses it when a file is not the one recorded
(`check_recorded_files`).

What survives what (docs/reliability.md, "Run folder guarantees"):
  - Every JSON and npz file is written whole or not at all: a temporary file
    in the same folder, fsync, `os.replace`. Orbax does the same for
    checkpoint folders. A full disk or a kill leaves the previous version.
  - `metrics.jsonl` is append-only; a torn last line is dropped by the reader
    and cut off before the next append.
  - A checkpoint that does not restore is reported in one line and the next
    older one is tried (a damaged newer one is moved to `damaged/` once an
    older one restores, so training can save that step again); a damaged
    `best/` gives way to the latest checkpoint. Only when nothing restores is
    it an error (`RunFolderError`, naming the folder).
  - `run.json`, `best_score.json` and `train_time.json` can be lost or damaged:
    the checkpoints carry what they hold, and `run.json` is rebuilt from the
    newest checkpoint, never from the new command line.
  - A run reads only what it wrote. `run.json` holds the run's id (`run_id`,
    made when the folder is first recorded); every checkpoint and `best/`
    carries it and its step. A checkpoint or `best/` of another run (copied
    in) is refused in one line (`RunFolderError`), in training and in
    `load_run`; so is one whose carried step is not its folder's. A `best/`
    ahead of the state a run starts from (its checkpoints were removed, or a
    crash came between the validation and the next checkpoint) was not
    reached by this history: training sets it aside (`set_aside/`, with a
    line) and the validations from there on choose the best again. Folders
    written before run ids existed carry none and are taken as they are.
  - A reader (`load_run`) racing a training process: a `best/` or
    checkpoint that the writer replaced while it was read is read again at
    its new step, not reported as damaged.
  - One process per folder: the first process of a job holds an exclusive
    `flock` on `.lock`; a second is refused at once, naming the holder. The
    operating system drops the lock when its holder dies, so a stale lock is
    simply taken over. The other processes of a multi-host job share the
    folder without taking it.
  - An environment problem (a file where the folder should be, a read-only
    folder, a full disk) is a `StorageError`: one line naming the path.
  - A checkpoint that does not restore is one line; the tracebacks orbax and
    TensorStore leave behind it are dropped (`drop_restore_noise`).
"""

# One namespace for the package's callers: `run_folder.<name>`.
from vampire_jax.runs.run_folder.checkpoints import (
  RunCheckpoints as RunCheckpoints,
)
from vampire_jax.runs.run_folder.checksums import (
  check_recorded_files as check_recorded_files,
)
from vampire_jax.runs.run_folder.reading import (
  environment_cause as environment_cause,
)
from vampire_jax.runs.run_folder.reading import (
  read_checkpoint as read_checkpoint,
)
from vampire_jax.runs.run_folder.reading import (
  restore_target as restore_target,
)
from vampire_jax.runs.run_folder.folder_lock import (
  check_not_in_use as check_not_in_use,
)
from vampire_jax.runs.run_folder.folder_lock import (
  lock as lock,
)
from vampire_jax.runs.run_folder.record import (
  check_new_record as check_new_record,
  check_record_matches_checkpoints as check_record_matches_checkpoints,
)
from vampire_jax.runs.run_folder.record import (
  check_resumable as check_resumable,
)
from vampire_jax.runs.run_folder.record import (
  check_model_recordable as check_model_recordable,
)
from vampire_jax.runs.run_folder.record import (
  checkpointed_record as checkpointed_record,
)
from vampire_jax.runs.run_folder.record import (
  config_class_name as config_class_name,
)
from vampire_jax.runs.run_folder.record import (
  device_description as device_description,
)
from vampire_jax.runs.run_folder.record import (
  folder_run_id as folder_run_id,
)
from vampire_jax.runs.run_folder.record import (
  forget_unused_record as forget_unused_record,
)
from vampire_jax.runs.run_folder.record import (
  git_commit as git_commit,
)
from vampire_jax.runs.run_folder.record import (
  latest_checkpoint_step as latest_checkpoint_step,
)
from vampire_jax.runs.run_folder.record import (
  make_folder as make_folder,
)
from vampire_jax.runs.run_folder.record import (
  read_run_record as read_run_record,
)
from vampire_jax.runs.run_folder.record import (
  run_record as run_record,
)
from vampire_jax.runs.run_folder.record import (
  recorded_x64 as recorded_x64,
)
from vampire_jax.runs.run_folder.record import (
  x64_enabled as x64_enabled,
)
from vampire_jax.runs.run_folder.record import (
  save_per_task as save_per_task,
)
from vampire_jax.runs.run_folder.record import (
  with_run_id as with_run_id,
)
from vampire_jax.runs.run_folder.record import (
  write_results as write_results,
)
from vampire_jax.runs.run_folder.record import (
  write_run_record as write_run_record,
)
from vampire_jax.runs.run_folder.restore_noise import (
  drop_restore_noise as drop_restore_noise,
)
from vampire_jax.runs.run_folder.restore_noise import (
  is_event_loop_noise as is_event_loop_noise,
)
from vampire_jax.runs.run_folder.storage import (
  BEST_SCORE_FILE as BEST_SCORE_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  CONFIG_FILE as CONFIG_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  DAMAGED_FOLDER as DAMAGED_FOLDER,
)
from vampire_jax.runs.run_folder.storage import (
  LOCK_FILE as LOCK_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  METRICS_FILE as METRICS_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  PER_TASK_FILE as PER_TASK_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  RESULTS_FILE as RESULTS_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  RUN_RECORD as RUN_RECORD,
)
from vampire_jax.runs.run_folder.storage import (
  RUN_RECORD_FORMAT as RUN_RECORD_FORMAT,
)
from vampire_jax.runs.run_folder.storage import (
  SET_ASIDE_FOLDER as SET_ASIDE_FOLDER,
)
from vampire_jax.runs.run_folder.storage import (
  TRAIN_TIME_FILE as TRAIN_TIME_FILE,
)
from vampire_jax.runs.run_folder.storage import (
  append_line as append_line,
)
from vampire_jax.runs.run_folder.storage import (
  check_writable as check_writable,
)
from vampire_jax.runs.run_folder.storage import (
  drop_rows_after as drop_rows_after,
)
from vampire_jax.runs.run_folder.storage import (
  json_bytes as json_bytes,
)
from vampire_jax.runs.run_folder.storage import (
  open_log as open_log,
)
from vampire_jax.runs.run_folder.storage import (
  read_json as read_json,
)
from vampire_jax.runs.run_folder.storage import (
  read_log as read_log,
)
from vampire_jax.runs.run_folder.storage import (
  read_metrics as read_metrics,
)
from vampire_jax.runs.run_folder.storage import (
  save_npz as save_npz,
)
from vampire_jax.runs.run_folder.storage import (
  storage_errno as storage_errno,
)
from vampire_jax.runs.run_folder.storage import (
  storage_error as storage_error,
)
from vampire_jax.runs.run_folder.storage import (
  write_atomic as write_atomic,
)
from vampire_jax.runs.run_folder.storage import (
  write_json as write_json,
)
from vampire_jax.runs.run_folder.storage import (
  writing as writing,
)
