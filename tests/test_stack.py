"""The pinned stack and its known pitfalls (docs/design.md, "The stack"), each handled on
purpose."""
import io

import pytest
import torch


def test_versions_are_the_measured_stack():
    import mmcv
    import mmdet
    import mmengine
    import mmpretrain
    import mmseg
    import numpy
    import torchvision
    assert torch.__version__.startswith('2.14.1')
    assert torchvision.__version__.startswith('0.29.1')
    assert (mmcv.__version__, mmengine.__version__, mmdet.__version__, mmseg.__version__,
            mmpretrain.__version__) == ('2.1.0', '0.10.7', '3.3.0', '1.2.2', '1.2.0')
    assert int(numpy.__version__.split('.')[0]) >= 2


def test_installed_metadata_has_the_package_version():
    """pip show / mim list / importlib.metadata read the metadata written at install time; the
    installer reinstalls when mmlinattn/version.py changes, so the two agree."""
    import importlib.metadata

    import mmlinattn
    assert importlib.metadata.version('mmlinattn') == mmlinattn.__version__


def test_mmcv_has_its_compiled_ops():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    dets, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
    assert keep.tolist() == [0, 2]
    out = RoIAlign((2, 2), 1.0, 0)(torch.ones(1, 1, 8, 8), torch.tensor([[0., 0., 0., 4., 4.]]))
    assert torch.allclose(out, torch.ones(1, 1, 2, 2))


def test_setuptools_keeps_pkg_resources_for_base_config_inheritance():
    import setuptools
    assert int(setuptools.__version__.split('.')[0]) < 82
    import pkg_resources  # noqa: F401  (mmengine's `mmdet::` resolution imports it)
    from mmengine.config import Config
    cfg = Config.fromstring("_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'\n", '.py')
    assert cfg.model.type == 'MaskRCNN'


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_one_registration_three_scopes(scope):
    import importlib

    import torch.nn as nn
    from mmengine.registry import MODELS as ROOT

    import mmlinattn  # noqa: F401

    name = f'_DummyFor{scope}'
    if name not in ROOT.module_dict:
        ROOT.register_module(name=name, module=type(name, (nn.Module,), {}))
    registry = importlib.import_module(f'{scope}.registry').MODELS
    assert registry.get(name) is ROOT.get(name)
    assert type(registry.build(dict(type='MAViT', arch='tiny'))).__name__ == 'MAViT'
    assert registry.get('InLineSwin') is not None and registry.get('InLinePVT') is not None


def test_mmengine_history_buffer_checkpoints_load_weights_only():
    """torch >= 2.6 loads weights-only by default; mmengine's message hub pickles HistoryBuffers
    (and, unpatched, their bound methods via builtins.getattr)."""
    from mmengine.logging import HistoryBuffer

    import mmlinattn.upstream_fixes  # noqa: F401  (applies the fix: our tools and configs import it)
    from mmlinattn.training import compat
    if not compat._torch_loads_weights_only_by_default():
        pytest.skip(f'torch {torch.__version__} loads full pickles by default: nothing to fix')
    buf = HistoryBuffer()
    for v in (1.0, 2.0, 4.0):
        buf.update(v)
    f = io.BytesIO()
    torch.save({'message_hub': {'log_scalars': {'loss': buf}}, 'w': torch.ones(2)}, f)
    f.seek(0)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(f.getvalue()))
    assert 'builtins.getattr' not in unsafe
    obj = torch.load(f, weights_only=True)
    loaded = obj['message_hub']['log_scalars']['loss']
    assert loaded.mean() == pytest.approx(7 / 3) and loaded.current() == 4.0
    assert loaded.statistics('max') == 4.0


def test_amp_on_cpu_is_refused_clearly():
    from mmengine.config import Config

    from mmlinattn.training.cli import enable_amp
    from mmlinattn.training.config import ConfigError
    if torch.cuda.is_available():
        pytest.skip('a GPU is present: --amp is allowed')
    with pytest.raises(ConfigError, match='--amp needs a CUDA GPU'):
        enable_amp(Config(dict(optim_wrapper=dict(type='OptimWrapper'))))


def test_reading_a_checkpoint_leaves_the_allow_list_as_it_was(tmp_path):
    """read_checkpoint allows numpy's data types for its own load only: torch's allow-list is the
    same list afterwards (torch's ``safe_globals`` context would also have removed entries that
    were allowed before it, which broke mmengine's later weights-only loads), and a file with
    numpy scalars still reads."""
    import numpy as np

    import mmlinattn.upstream_fixes  # noqa: F401  (allows numpy process-wide on torch >= 2.6)
    from mmlinattn.core.weights import read_checkpoint
    get = lambda: set(map(repr, getattr(torch.serialization, 'get_safe_globals', list)()))  # noqa: E731
    before = get()
    a = tmp_path / 'a.pth'
    torch.save({'model': {'w': torch.ones(1)}, 'acc': np.float64(81.2)}, a)
    assert read_checkpoint(str(a))['acc'] == np.float64(81.2)
    assert get() == before
    b = tmp_path / 'b.pth'
    torch.save({'meta': {'arr': np.arange(3), 'x': np.float32(1.5)}}, b)
    assert torch.load(b)['meta']['x'] == np.float32(1.5)  # as mmengine loads, on any torch


def test_safe_checkpoint_hook_leaves_other_storage_to_mmengine(tmp_path):
    """A SafeCheckpointHook whose file backend is not the local disk (backend_args or a path
    prefix) saves through the runner's own save_checkpoint under the final name, in one request:
    no temporary file and rename."""
    from mmlinattn.training.hooks import SafeCheckpointHook
    calls = []

    class Runner:
        def save_checkpoint(self, out_dir, filename, *args, **kwargs):
            calls.append((out_dir, filename))

    hook = SafeCheckpointHook(interval=1)
    hook.file_backend = object()  # e.g. a Petrel or HTTP backend
    hook.save_atomically(Runner(), str(tmp_path), 'epoch_1.pth', meta={})
    assert calls == [(str(tmp_path), 'epoch_1.pth')]
    # on the local disk: written under a temporary name, then renamed into place
    from mmengine.fileio import LocalBackend
    hook.file_backend = LocalBackend()
    calls.clear()

    class Writing(Runner):
        def save_checkpoint(self, out_dir, filename, *args, **kwargs):
            super().save_checkpoint(out_dir, filename)
            torch.save({'w': torch.ones(1)}, f'{out_dir}/{filename}')

    hook.save_atomically(Writing(), str(tmp_path), 'epoch_2.pth', meta={})
    assert len(calls) == 1 and calls[0][1].startswith('epoch_2.pth.tmp-')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['epoch_2.pth']


def test_patches_are_skipped_with_a_warning_on_other_mmengine_versions(monkeypatch):
    import mmengine
    from mmengine.logging import HistoryBuffer

    import mmlinattn.training.compat as compat
    before = HistoryBuffer.__getstate__
    monkeypatch.setattr(compat, '_APPLIED', False)
    monkeypatch.setattr(compat, 'STATUS', {})
    monkeypatch.setattr(mmengine, '__version__', '0.11.0')
    with pytest.warns(RuntimeWarning, match='written for mmengine 0.10.x, found 0.11.0'):
        compat.apply()
    assert set(compat.STATUS) == set(compat.PATCHES)
    # the mmengine patch is skipped; numpy's allow-list and the local loader (mmengine's public
    # CheckpointLoader.register_scheme, no private name) depend on torch only
    for name in ('numpy_globals', 'local_loader'):
        status = compat.STATUS.pop(name)
        assert status is True or status.startswith(f'not needed: torch {torch.__version__}')
    assert all(v.startswith('written for mmengine 0.10.x') for v in compat.STATUS.values())
    assert HistoryBuffer.__getstate__ is before    # nothing patched again


def test_patches_leave_an_upstream_that_is_already_fixed_alone(monkeypatch, recwarn):
    """Each fix looks at the behaviour it fixes: a HistoryBuffer that pickles only data is not
    patched (and nothing warns); neither HistoryBuffer nor the allow-list where torch does not
    load weights-only by default (torch < 2.6, or TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)."""
    from mmengine.logging import HistoryBuffer

    import mmlinattn.training.compat as compat

    def data_only(self):
        return {'max_length': self.max_length}

    monkeypatch.setattr(HistoryBuffer, '__getstate__', data_only)
    monkeypatch.setattr(compat, '_APPLIED', False)
    monkeypatch.setattr(compat, 'STATUS', {})
    compat.apply()
    assert HistoryBuffer.__getstate__ is data_only
    assert compat.STATUS['history_buffer'].startswith('not needed')
    assert not [w for w in recwarn if 'mmlinattn' in str(w.message)]

    monkeypatch.setattr(compat, '_APPLIED', False)
    monkeypatch.setattr(compat, 'STATUS', {})
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    assert not compat._torch_loads_weights_only_by_default()
    compat.apply()
    assert compat.STATUS['history_buffer'] == (f'not needed: torch {torch.__version__} does not '
                                               'load weights-only by default')
    assert compat.STATUS['numpy_globals'].startswith('not needed')


def test_runner_checkpoint_reader_allows_history_buffer_methods_only(tmp_path, monkeypatch):
    """load_runner_checkpoint (our tools' fallback for files mmengine wrote without the fixes)
    reads HistoryBuffers pickled with their methods (builtins.getattr on HistoryBuffer), and
    refuses getattr on anything else: torch's weights-only loader with a getattr of its own, for
    that load only (the process's allow-list is the same afterwards)."""
    import collections

    from mmengine.logging import HistoryBuffer

    from mmlinattn.core.weights import CheckpointError, load_runner_checkpoint
    from mmlinattn.core.weights.allowlist import runner_allowlist_supported
    if not runner_allowlist_supported():
        pytest.skip(f'torch {torch.__version__} has no weights-only allow-list')
    buf = HistoryBuffer()
    buf.update(3.0)

    def upstream_getstate(self):  # mmengine 0.10's own: the class's statistics functions too
        return dict(self.__dict__, statistics_methods={'mean': HistoryBuffer.mean})

    monkeypatch.setattr(HistoryBuffer, '__getstate__', upstream_getstate)
    good = tmp_path / 'good.pth'
    torch.save({'message_hub': {'loss': buf}, 'w': torch.ones(1)}, good)
    monkeypatch.undo()
    if hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint'):  # torch >= 2.5
        assert 'builtins.getattr' in \
            torch.serialization.get_unsafe_globals_in_checkpoint(str(good))
    get = lambda: set(map(repr, torch.serialization.get_safe_globals()))  # noqa: E731
    before = get()
    loaded = load_runner_checkpoint(str(good))
    assert loaded['message_hub']['loss'].mean() == 3.0 and get() == before

    class Gadget:
        def __reduce__(self):
            return (getattr, (collections.OrderedDict, 'fromkeys'))

    bad = tmp_path / 'bad.pth'
    torch.save({'x': Gadget()}, bad)
    with pytest.raises(CheckpointError, match='bad.pth is not a readable Runner checkpoint'):
        load_runner_checkpoint(str(bad))
    assert get() == before
