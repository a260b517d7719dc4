"""The authors' checkpoints (and ours), as the backbones load them: :mod:`.reading` (the safe
weights-only reader), :mod:`.urls` (URLs fetched once into a cache), :mod:`.fitting` (a state dict
fitted to a backbone with an exact report; whole-model checks) and :mod:`.layouts`
(:class:`AuthorsLayout`). Writing checkpoints belongs to :mod:`mmlinattn.training.fileio`.
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
