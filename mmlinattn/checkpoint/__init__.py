"""Checkpoints: reading the authors' files (and ours) safely, http(s) URLs, fitting a state dict to
a backbone with an exact report, the family layouts of the released files, and the ``--resume``
search.

* :mod:`.reading` - the weights-only reader with its restricted unpickler, and
  ``extract_state_dict``;
* :mod:`.urls` - URLs fetched once into torch's hub cache, and the authors' URL table;
* :mod:`.fitting` - ``fit_state_dict``, ``fit_backbone_checkpoint`` (the one path a backbone's
  pretrained file is fitted through) and ``check_model_checkpoint``;
* :mod:`.layouts` - :class:`AuthorsLayout`;
* :mod:`.resume` - ``latest_intact_checkpoint``.

Writing files atomically and reading ``last_checkpoint`` are in :mod:`mmlinattn.fileio`, which
imports nothing of the package; ``write_atomic`` is handed on here for the tools.
"""
from ..fileio import write_atomic
from .errors import CheckpointError
from .fitting import check_model_checkpoint, fit_backbone_checkpoint, fit_state_dict
from .layouts import AuthorsLayout
from .reading import (
    ForeignObject,
    _RestrictedUnpickler,
    extract_state_dict,
    load_runner_checkpoint,
    read_checkpoint,
)
from .resume import latest_intact_checkpoint
from .urls import (
                   AUTHORS_CHECKPOINTS,
                   AuthorsCheckpoint,
                   checkpoint_file_problem,
                   is_url,
                   local_checkpoint,
                   url_cache_path,
)

__all__ = ['AUTHORS_CHECKPOINTS', 'AuthorsCheckpoint', 'AuthorsLayout', 'CheckpointError',
           'ForeignObject', 'check_model_checkpoint', 'checkpoint_file_problem',
           'extract_state_dict', 'fit_backbone_checkpoint', 'fit_state_dict', 'is_url',
           'latest_intact_checkpoint', 'load_runner_checkpoint', 'local_checkpoint',
           'read_checkpoint', 'url_cache_path',
           'write_atomic', '_RestrictedUnpickler']
