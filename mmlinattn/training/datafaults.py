"""A data file that cannot be read is named where it is first used.

mmcv's image loader fails on a truncated or corrupt image with ``AssertionError: failed to load
image`` and mmseg's label loader with PIL's ``OSError: image file is truncated``, both deep in a
traceback from inside the data loader (the second without the file's name). ``import mmlinattn``
changes none of that. :class:`~mmlinattn.training.runner.LinAttnRunner` (our configs' Runner,
under any tool) builds its data loaders through :func:`naming_unreadable_files`: each dataset's
``prepare_data`` (mmengine's
``BaseDataset`` method, which every mmdet, mmseg and mmpretrain dataset uses to load one sample) is
wrapped on that dataset object only, and turns such a failure into a :class:`DataFileError` naming
the file, whether it is the image or the label map, the reason, the sample and the dataset's config
key. It does so only after re-reading the sample's files and finding one that does not decode; any
other error of the pipeline passes through unchanged. The data loader's iteration turns it into the
run's one line (exit code 2).

Files that are listed but missing are found earlier, by the pre-flight checks (existence only).
"""
import os.path as osp
from typing import Optional

#: the files a sample's ``data_info`` may name, and what to call them in a message
SAMPLE_FILES = (('img_path', 'image'), ('seg_map_path', 'label map'))


class DataFileError(RuntimeError):
    """A sample's image or label map could not be read; the message names it.

    Raised in a data loader worker, it reaches the main process re-created from torch's text of the
    worker's traceback; ``str()`` then gives back the original one-line message."""

    def __str__(self):
        text = super().__str__()
        marker = 'DataFileError: '
        if 'Original Traceback' in text and marker in text:
            return text.rsplit(marker, 1)[1].strip()
        return text


def unreadable(path: str) -> Optional[str]:
    """Why ``path`` cannot be read as an image (missing, truncated, not an image), or None if it
    decodes whole (PIL, which reports a truncated file where OpenCV returns nothing)."""
    if not osp.isfile(path):
        return 'file not found'
    from PIL import Image
    try:
        with Image.open(path) as im:
            im.load()
    except Exception as e:  # PIL's decoders only: a damaged file raises OSError,
        # SyntaxError, ValueError, struct.error, DecompressionBombError...; each is the answer
        # (named with its type), none passes silently
        return f'{type(e).__name__}: {e}'
    return None


def dataset_key(dataset) -> str:
    """The config key a dataset comes from, as far as it knows (training or evaluation)."""
    if getattr(dataset, 'test_mode', False):
        return 'val_dataloader.dataset / test_dataloader.dataset'
    return 'train_dataloader.dataset'


class NamedPrepare:
    """A dataset's ``prepare_data`` that names an unreadable file (see the module docstring); set
    as the dataset object's own attribute by :func:`name_unreadable_files_in`. Pickles with the
    dataset (data loader workers started with spawn get it too)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __call__(self, idx):
        ds = self.dataset
        try:
            return type(ds).prepare_data(ds, idx)
        except DataFileError:
            raise
        except Exception as error:  # inspected, then re-raised as it is (bare raise
            # below) unless a file of the sample is found unreadable (DataFileError from it)
            try:
                info = ds.get_data_info(idx)
            except Exception:  # the sample's record itself fails: the first error is
                raise error  # raised (this one chained to it as its context), nothing swallowed
            for key, what in SAMPLE_FILES:
                path = info.get(key) if isinstance(info, dict) else None
                reason = unreadable(path) if isinstance(path, str) else None
                if reason:
                    raise DataFileError(
                        f'{dataset_key(ds)} ({type(ds).__name__}, sample {idx}): cannot read '
                        f'the {what} {path}: {reason} (a truncated or corrupt file: replace it, or '
                        'remove it from the annotations)') from error
            raise


def name_unreadable_files_in(dataset) -> int:
    """Give ``dataset`` - and the datasets inside a wrapper (``ConcatDataset``, ``RepeatDataset``,
    ``ClassBalancedDataset``: their ``datasets`` / ``dataset``) - a :class:`NamedPrepare`. Returns
    how many datasets got one (0 for a dataset without ``prepare_data`` / ``get_data_info``)."""
    inner = list(getattr(dataset, 'datasets', None) or [])
    if getattr(dataset, 'dataset', None) is not None:
        inner.append(dataset.dataset)
    if inner:
        return sum(name_unreadable_files_in(d) for d in inner)
    if not (callable(getattr(type(dataset), 'prepare_data', None))
            and hasattr(dataset, 'get_data_info')):
        return 0
    if not isinstance(dataset.__dict__.get('prepare_data'), NamedPrepare):
        dataset.prepare_data = NamedPrepare(dataset)
    return 1


_ONE_LINE = {}


def _one_line_loader(loader):
    """``loader`` whose iteration turns a :class:`DataFileError` (raised here, or in a worker and
    re-raised here by torch) into the run's one line (``refuse``: exit 2, no traceback): its class
    becomes a subclass of its own with that ``__iter__`` (a loop may iterate it many times)."""
    cls = type(loader)
    if cls not in _ONE_LINE:

        def __iter__(self):
            it = cls.__iter__(self)
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except DataFileError as e:
                    from .refusal import refuse
                    raise refuse(e) from None
                yield batch

        _ONE_LINE[cls] = type(cls.__name__, (cls,), {'__iter__': __iter__,
                                                     '__module__': cls.__module__})
    loader.__class__ = _ONE_LINE[cls]
    return loader


def naming_unreadable_files(build_dataloader):
    """``Runner.build_dataloader`` whose datasets name an unreadable file
    (:func:`name_unreadable_files_in`) and whose iteration stops the run in one line there."""

    def build(dataloader, *args, **kwargs):
        loader = build_dataloader(dataloader, *args, **kwargs)
        if name_unreadable_files_in(getattr(loader, 'dataset', None)) and \
                hasattr(type(loader), '__iter__'):
            loader = _one_line_loader(loader)
        return loader

    return build
