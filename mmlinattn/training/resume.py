"""Which checkpoint ``--resume`` continues from: the newest intact one of a work dir."""
import logging
import os
import os.path as osp
from typing import Optional

from mmlinattn.core.weights.errors import CheckpointError
from mmlinattn.core.weights.reading import CheckpointContents, extract_state_dict, read_contents
from mmlinattn.training.fileio import POINTER, last_checkpoint


def latest_intact_checkpoint(work_dir: str, logger: Optional[logging.Logger] = None
                             ) -> Optional[str]:
    """The path of :func:`latest_intact_contents`: the checkpoint ``--resume`` (auto) should use,
    or None (a fresh start)."""
    contents = latest_intact_contents(work_dir, logger)
    return contents.path if contents is not None else None


def latest_intact_contents(work_dir: str, logger: Optional[logging.Logger] = None
                           ) -> Optional[CheckpointContents]:
    """The checkpoint ``--resume`` (auto) should use: the one ``last_checkpoint`` names if it reads,
    else the newest readable ``*.pth`` of ``work_dir`` that a Runner saved (weights
    without a training state are passed over), with a warning naming each skipped file.
    A ``last_checkpoint`` that names a file outside ``work_dir`` while ``work_dir`` holds
    checkpoints of its own (a work dir copied from another) comes after them, with a warning.
    A file "reads" when it loads the way :class:`~mmlinattn.training.runner.LinAttnRunner` will load
    it (:func:`~mmlinattn.core.weights.reading.read_contents`), so what this lets through resumes;
    the chosen file's contents are returned, for the Runner to resume from without reading it again.

    Returns ``None`` when the work dir holds no checkpoint (a fresh start); raises
    :class:`CheckpointError` listing the files when there are checkpoints but none is readable.
    """
    logger = logger or logging.getLogger('mmlinattn')
    if not osp.isdir(work_dir):
        return None
    candidates, skipped, foreign = [], [], 0
    try:
        named = last_checkpoint(work_dir, must_exist=False)
    except (OSError, UnicodeDecodeError) as e:
        named = None
        skipped.append(f'{osp.join(work_dir, POINTER)} (unreadable: {e})')
    files = [osp.join(work_dir, f) for f in os.listdir(work_dir) if f.endswith('.pth')]
    copied = bool(named and files and
                  osp.dirname(osp.realpath(named)) != osp.realpath(work_dir))
    if copied:
        # a work dir copied from another (an experiment branched by copying its folder): its
        # last_checkpoint still names the original's file; this folder's own checkpoints go first
        logger.warning(f'--resume: {osp.join(work_dir, POINTER)} names {named}, outside this work '
                       f'dir (copied from another?): {work_dir}\'s own checkpoints come first '
                       '(--resume PATH resumes from that file)')
        # tried only where the folder holds weights and no training checkpoint of its own
        fallback, named = named, None
    if named:
        candidates.append(named)
    elif osp.isfile(osp.join(work_dir, POINTER)) and not skipped and not copied:
        # mmengine writes it after each save: empty when a run was killed while writing it
        skipped.append(f'{osp.join(work_dir, POINTER)} (empty)')
    for f in sorted(files, key=lambda p: (osp.getmtime(p), p), reverse=True):
        if not any(osp.realpath(f) == osp.realpath(c) for c in candidates):
            candidates.append(f)
    if copied:
        candidates.append(fallback)
    for path in candidates:
        if copied and path == fallback and foreign < len(files):
            break  # the folder's own training checkpoints, none intact: said below
        if not osp.isfile(path):
            skipped.append(f'{path} (not found)')
            continue
        try:
            contents = read_contents(path)
            extract_state_dict(contents.obj, path=path)
        except CheckpointError as err:
            why = str(err).split('(', 1)[-1].rstrip(')')[:120] if '(' in str(err) else str(err)
            skipped.append(f'{path} (unreadable: {why})')
            continue
        if not (isinstance(contents.obj, dict) and isinstance(contents.obj.get('meta'), dict)):
            # weights put there by hand (a backbone, a converted file): nothing to resume
            skipped.append(f'{path} (no training state: not a checkpoint the Runner saved)')
            foreign += 1
            continue
        if skipped:
            which = ('the checkpoint last_checkpoint names' if copied and path == fallback
                     else 'the newest intact checkpoint')
            logger.warning('--resume: skipped ' + '; '.join(skipped) +
                           f' - resuming from {path}, {which}')
        return contents
    if len(candidates) > foreign:  # Runner checkpoints, none of them intact
        raise CheckpointError(
            f'--resume: no intact checkpoint in {work_dir}: ' + '; '.join(skipped) +
            '. Pass one explicitly (--resume PATH) or start without --resume.')
    if skipped:  # a pointer file, or weights, and no checkpoint: said, then a fresh start
        logger.warning('--resume: skipped ' + '; '.join(skipped) + ' - no checkpoint of a '
                       f'training in {work_dir}: starting from the beginning')
    return None
