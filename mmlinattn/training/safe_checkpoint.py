"""``SafeCheckpointHook``: mmengine's ``CheckpointHook`` that never leaves a run without a
checkpoint.

mmengine 0.10's hook writes each checkpoint straight to its final name (a run killed while saving
leaves a truncated file that ``last_checkpoint`` may name), and with ``max_keep_ckpts`` it deletes
the oldest kept checkpoint *before* writing the new one (so does the previous best with
``save_best``): a write that fails (disk full) can leave none. On a local disk this hook

* writes every checkpoint it saves - periodic, best, and the one :class:`PreemptionHook` asks
  for - to a temporary file in the same folder and renames it into place;
* holds the deletions back until the new file and ``last_checkpoint`` are written;
* turns a failed write into :class:`mmlinattn.training.fileio.CheckpointWriteError`, one line naming
  the work dir, the bytes the checkpoint needs and the bytes free, and stops the run (exit 2; the
  previous checkpoint is kept);
* records the deletions it holds back in the message hub (``mmlinattn_pending_removals``: each
  file's name, size, mtime and inode), which is saved with the new checkpoint, and clears the
  record once they are done: a run resumed from a checkpoint whose save was killed before its
  deletions removes exactly those files (mmengine had already taken them off its rotation list,
  so they would otherwise stay for ever; one log line names them). A file of that name that is
  not the recorded one (a copy put back, a later run's) is kept.

Other storage (``backend_args`` or a path prefix selecting another backend) keeps mmengine's own
behaviour, one request per file. It takes every argument of ``CheckpointHook``; our configs name it
(``default_hooks.checkpoint.type``: our runtimes and schedules), and any config can opt in by naming
it; a config that names mmengine's ``CheckpointHook`` gets that one. Nothing of mmengine is
patched.
"""
import os
import os.path as osp

from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from .fileio import checkpoint_write_error, write_atomic

#: message-hub key: the files whose deletion waits for the checkpoint being saved
PENDING = 'mmlinattn_pending_removals'


def _identity(path: str) -> list:
    """What names one file on disk for a held deletion: its name, size, mtime (ns) and inode. A
    resumed run removes a file only while it is still that file, not another one of the same name
    (a copy put back, a later run's)."""
    try:
        st = os.stat(path)
    except OSError:
        return [osp.basename(path), -1, -1, -1]
    return [osp.basename(path), st.st_size, st.st_mtime_ns, st.st_ino]


class _HeldDeletions:
    """A file backend whose ``remove`` / ``rmtree`` are recorded instead of run."""

    def __init__(self, backend):
        self._backend, self.held = backend, []

    def remove(self, path):
        self.held.append(('remove', path))

    def rmtree(self, path):
        self.held.append(('rmtree', path))

    def __getattr__(self, name):
        return getattr(self._backend, name)


class _AtomicSaves:
    """The runner as the hook sees it, with ``save_checkpoint`` writing through a temporary file."""

    def __init__(self, runner, hook):
        self._runner, self._hook = runner, hook

    def save_checkpoint(self, out_dir, filename, *args, **kwargs):
        return self._hook.save_atomically(self._runner, out_dir, filename, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._runner, name)


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with atomic writes and rotation after the save (module docstring)."""

    _saving = False  # a save of ours is under way ...
    _pending = None  # ... and this is its checkpoint dict (for the size in an error), else None

    def _is_local(self) -> bool:
        return isinstance(getattr(self, 'file_backend', None), (LocalBackend, _HeldDeletions))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self._saving:  # kept for the duration of our own save only
            self._pending = checkpoint

    def save_atomically(self, runner, out_dir, filename, *args, **kwargs):
        """``runner.save_checkpoint(out_dir, filename, ...)`` written to a temporary file next to
        the target and renamed into place (local disks); elsewhere as mmengine writes it."""
        import mmengine.runner
        flexible = getattr(mmengine.runner, 'FlexibleRunner', ())
        if not self._is_local() or isinstance(runner, flexible):
            # other storage, or FlexibleRunner (DeepSpeed / FSDP: every rank writes, a folder per
            # checkpoint): as mmengine writes it
            return runner.save_checkpoint(out_dir, filename, *args, **kwargs)
        from mmengine.dist import is_main_process
        path = osp.join(out_dir, filename)
        if not is_main_process():  # Runner.save_checkpoint is master_only: nothing to rename
            return runner.save_checkpoint(out_dir, filename, *args, **kwargs)
        self._saving = True
        if isinstance(self.file_backend, _HeldDeletions):  # saved with it, cleared after them
            runner.message_hub.update_info(PENDING, [_identity(p)
                                                     for _, p in self.file_backend.held])
        try:
            write_atomic(path, lambda tmp: runner.save_checkpoint(
                osp.dirname(tmp), osp.basename(tmp), *args, **kwargs))
        except OSError as e:
            from .refusal import refuse  # one line under any tool, the run stops (exit 2)
            raise refuse(checkpoint_write_error(self._pending or {}, path, e)) from None
        finally:
            self._saving, self._pending = False, None

    def before_train(self, runner) -> None:
        super().before_train(runner)
        from mmengine.dist import is_main_process
        pending = runner.message_hub.runtime_info.get(PENDING) or []
        if not (pending and self._is_local() and is_main_process()):
            return
        removed, kept = [], []
        for entry in pending:  # names only, inside this run's checkpoint folder
            name = entry[0] if isinstance(entry, (list, tuple)) and entry else entry
            path = osp.join(self.out_dir, osp.basename(str(name)))
            if not osp.isfile(path):
                continue
            if isinstance(entry, (list, tuple)) and list(entry) == _identity(path):
                os.remove(path)
                removed.append(osp.basename(path))
            else:  # another file of that name (put back, or written since): not ours to remove
                kept.append(osp.basename(path))
        if kept:
            runner.logger.warning(
                f'kept {", ".join(kept)} in {self.out_dir}: the checkpoint names it in a rotation '
                'it held back, but the file there now is another one (put back or written since)')
        runner.message_hub.update_info(PENDING, [])
        if removed:
            runner.logger.warning(
                f'finished the checkpoint rotation that a killed save left undone: removed '
                f'{", ".join(removed)} from {self.out_dir}')

    def _holding_deletions(self, save, runner, *args):
        if not self._is_local() or isinstance(self.file_backend, _HeldDeletions):
            return save(runner if isinstance(runner, _AtomicSaves) else _AtomicSaves(runner, self),
                        *args)
        backend = self.file_backend
        self.file_backend = held = _HeldDeletions(backend)
        try:
            save(_AtomicSaves(runner, self), *args)
        finally:
            self.file_backend = backend
        for how, path in held.held:  # the new checkpoint is written: now the rotation
            getattr(backend, how)(path)
        runner.message_hub.update_info(PENDING, [])

    def _save_checkpoint_with_step(self, runner, step, meta):
        if not self._is_local():
            return super()._save_checkpoint_with_step(runner, step, meta)
        self._holding_deletions(super()._save_checkpoint_with_step, runner, step, meta)

    def _save_best_checkpoint(self, runner, metrics) -> None:
        if not self._is_local():
            return super()._save_best_checkpoint(runner, metrics)
        self._holding_deletions(super()._save_best_checkpoint, runner, metrics)
