"""The authors' checkpoints (and ours), as the backbones load them: reading files safely, http(s)
URLs, fitting a state dict to a backbone with an exact report, and the families' released layouts.

* :mod:`.reading` - the weights-only reader with its restricted unpickler, ``extract_state_dict``
  and ``load_runner_checkpoint`` (a Runner's checkpoint read the way the Runner will);
* :mod:`.urls` - URLs fetched once into a cache keyed by URL;
* :mod:`.fitting` - ``fit_state_dict``, ``fit_backbone_checkpoint`` (the one path a backbone's
  pretrained file is fitted through) and ``check_model_checkpoint``;
* :mod:`.layouts` - :class:`AuthorsLayout`.

Part of the core: imports nothing of mmlinattn outside :mod:`mmlinattn.core`. Writing checkpoints
(atomically) belongs to training (:mod:`mmlinattn.training.fileio`); the ``--resume`` search to our
tools (``tools/workshop/apis/resume.py``).
"""
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
from .urls import (
                   BASE_URL_ENV,
                   checkpoint_file_problem,
                   is_url,
                   local_checkpoint,
                   source_url,
                   url_cache_path,
)

__all__ = ['AuthorsLayout', 'BASE_URL_ENV', 'CheckpointError',
           'ForeignObject', 'check_model_checkpoint', 'checkpoint_file_problem',
           'extract_state_dict', 'fit_backbone_checkpoint', 'fit_state_dict', 'is_url',
           'load_runner_checkpoint', 'local_checkpoint',
           'read_checkpoint', 'source_url', 'url_cache_path',
           '_RestrictedUnpickler']
