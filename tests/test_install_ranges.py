"""Installing into a user's own OpenMMLab environment: setup.py declares version ranges (not the
pins of tools/install.sh) that hold both the pinned stack and the oldest supported one, and
checkpoints pickled under numpy 1 or numpy 2 load under either."""
import importlib.util
import io
import pickle
import pickletools
import re
import runpy
import subprocess
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

#: the oldest stack the project promises to run on (built by `make test-compat`): what most
#: mmdet 3.x users run, torch 2.1 being the newest torch with OpenMMLab's prebuilt mmcv 2.1.0 wheels
OLDEST = {'mmengine': '0.10.0', 'mmdet': '3.2.0', 'mmsegmentation': '1.2.1', 'mmpretrain': '1.1.1',
          'numpy': '1.24.4', 'opencv-python': '4.8.1.78', 'mmcv': '2.1.0', 'torch': '2.1.2'}
#: the environment OpenMMLab's install guide leaves for torch 2.1 (its prebuilt mmcv 2.1.0 wheels
#: are built for torch <= 2.1), as the user reports it (issue 57): `pip install mmlinattn` into it
#: must keep every one of these
STOCK = {'torch': '2.1.2', 'torchvision': '0.16.2', 'numpy': '1.24.4',
         'opencv-python': '4.8.1.78', 'mmengine': '0.10.4', 'mmcv': '2.1.0'}
#: packages whose range must be a range with an upper end (a user's stack has them)
STACK = ('mmcv', 'mmengine', 'mmdet', 'mmsegmentation', 'mmpretrain', 'numpy')


def _install_requires(monkeypatch) -> dict:
    """setup.py's install_requires with its ``[all]`` extra (the toolboxes): what
    ``pip install "mmlinattn[all]"`` asks for."""
    import setuptools
    captured = {}
    monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / 'setup.py'), run_name='__main__')
    reqs = [Requirement(r) for r in
            captured['install_requires'] + captured['extras_require']['all']]
    return {r.name.lower(): r for r in reqs}


def _pins(name: str) -> dict:
    """``name==version`` lines of a requirements file (what tools/install*.sh apply with -c)."""
    pins = {}
    for line in (ROOT / 'requirements' / name).read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[req.name.lower()] = req.specifier
    return pins


def _lower_end(spec) -> str:
    (low,) = [s.version for s in spec if s.operator in ('>=', '==')]
    return low


def test_install_requires_are_ranges_with_upper_ends(monkeypatch):
    declared = _install_requires(monkeypatch)
    for name in STACK:
        spec = declared[name].specifier
        assert not any(s.operator in ('==', '===') for s in spec), f'{name} is pinned: {spec}'
        assert any(s.operator == '<' for s in spec), f'{name} has no upper end: {spec}'
        assert any(s.operator == '>=' for s in spec), f'{name} has no lower end: {spec}'


def test_ranges_hold_the_pinned_and_the_oldest_stack(monkeypatch):
    declared = _install_requires(monkeypatch)
    pinned = _pins('constraints.txt')   # what tools/install.sh (make test) installs
    for name in STACK:
        spec = declared[name].specifier
        assert spec.contains(OLDEST[name]), f'{name} {OLDEST[name]} (oldest) outside {spec}'
        assert spec.contains(_lower_end(pinned[name])), f'{name} pin {pinned[name]} outside {spec}'
        if name != 'mmcv':   # one mmcv build serves both stacks
            assert Version(_lower_end(spec)) == Version(OLDEST[name]) or name == 'numpy', \
                f'{name}: the range starts at {_lower_end(spec)}, ' \
                f'the oldest tested is {OLDEST[name]}'
    # torch: from the users' torch 2.1 to the pinned one, no upper end (a user's torch is theirs)
    torch_spec = declared['torch'].specifier
    assert torch_spec.contains(OLDEST['torch']) and torch_spec.contains(_lower_end(pinned['torch']))
    assert not any(s.operator in ('<', '<=', '==') for s in torch_spec), torch_spec
    # the OpenMMLab pins are exact, so `make test` installs one stack
    for name in ('mmcv', 'mmengine', 'mmdet', 'mmsegmentation', 'mmpretrain', 'torch',
                 'torchvision'):
        assert [s.operator for s in pinned[name]] == ['=='], \
            f'constraints.txt: {name} {pinned[name]}'
    # the compat environment's constraints are the oldest stack
    oldest = _pins('oldest.txt')
    assert {n: _lower_end(oldest[n]) for n in OLDEST} == OLDEST


def test_install_requires_admit_the_stock_torch21_environment(monkeypatch):
    """pip keeps an installed package that every range naming it admits (resolver-level: the
    ranges of setup.py's install_requires against the stock versions)."""
    declared = _install_requires(monkeypatch)
    assert {'torch', 'numpy', 'opencv-python', 'mmengine', 'mmcv'} <= set(declared)
    outside = [f'{name} {have} (setup.py: {declared[name].specifier})'
               for name, have in STOCK.items()
               if name in declared and not declared[name].specifier.contains(have)]
    assert not outside, outside


def test_compat_environment_starts_as_the_stock_one():
    """tools/install_compat.sh (`make test-compat`) builds STOCK first, then installs mmlinattn
    the way docs/install.md says (a constraint file keeping torch, torchvision, numpy and
    opencv-python) and compares `pip freeze --all` before and after."""
    script = (ROOT / 'tools' / 'install_compat.sh').read_text()
    (line,) = [ln for ln in script.splitlines() if ln.startswith('STOCK=(')]
    pins = dict(p.split('==') for p in line[len('STOCK=('):-1].split())
    assert pins == {k: v for k, v in STOCK.items() if k != 'mmcv'}
    stock_at = script.index('pipq "${STOCK[@]}"')
    before_at = script.index('pip freeze --all | sort > "$before"')
    install_at = script.index('pipq -c "$keep" "$ROOT[all]"')
    after_at = script.index('pip freeze --all | sort > "$after"')
    oldest_at = script.index('-r "$ROOT/requirements/tests.txt"')
    assert stock_at < before_at < install_at < after_at < oldest_at
    keep = re.search(r"grep -iE '\^\(([a-z|-]+)\)=='", script).group(1).split('|')
    assert set(keep) == {'torch', 'torchvision', 'numpy', 'opencv-python'}
    docs = (ROOT / 'docs' / 'install.md').read_text()
    assert "grep -iE '^(torch|torchvision|numpy|opencv-python)==' > keep.txt" in docs
    assert 'pip install "/path/to/mmlinattn[all]" -c keep.txt' in docs
    r = subprocess.run(['bash', '-n', str(ROOT / 'tools' / 'install_compat.sh')],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_mmcv_range_is_what_mmdet_and_mmseg_accept(monkeypatch):
    import mmdet
    import mmseg
    spec = _install_requires(monkeypatch)['mmcv'].specifier
    assert not spec.contains(mmdet.mmcv_maximum_version)
    assert not spec.contains(mmseg.MMCV_MAX)
    assert spec.contains(version('mmcv'))


def test_the_running_environment_satisfies_install_requires(monkeypatch):
    """The pinned stack (`make test`) and the oldest one (`make test-compat`) both run this test."""
    for name, req in _install_requires(monkeypatch).items():
        assert req.specifier.contains(version(name), prereleases=True), \
            f'{name} {version(name)} is installed, setup.py asks for {req.specifier}'


def _array_pickle(arr, module: str) -> bytes:
    """A protocol-2 pickle of ``arr`` (what torch.save writes) naming ``module`` for numpy's
    ``_reconstruct`` and ``scalar``, whichever numpy runs the test: numpy 1 wrote
    ``numpy.core.multiarray``, numpy 2 writes ``numpy._core.multiarray``."""
    data = pickle.dumps(arr, protocol=2)
    for old in (b'numpy._core.multiarray\n', b'numpy.core.multiarray\n'):
        data = data.replace(old, module.encode() + b'\n')
    globals_named = {arg for op, arg, _ in pickletools.genops(data) if op.name == 'GLOBAL'}
    assert f'{module} _reconstruct' in globals_named, globals_named
    return data


def _torch_file(payload: bytes) -> bytes:
    """A torch.save zip whose pickle is ``payload`` (the checkpoint holds no tensors)."""
    src = io.BytesIO()
    torch.save({'meta': None}, src)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src.getvalue())) as zin, \
            zipfile.ZipFile(out, 'w', zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            body = payload if info.filename.endswith('/data.pkl') else zin.read(info)
            zout.writestr(info, body)
    return out.getvalue()


@pytest.mark.parametrize('module', ['numpy.core.multiarray', 'numpy._core.multiarray'])
def test_numpy_arrays_pickled_under_either_numpy_load(module, tmp_path):
    import mmlinattn.upstream_fixes  # noqa: F401  (numpy's types, where torch loads weights-only)
    from mmlinattn.core.weights import _RestrictedUnpickler, read_checkpoint
    from mmlinattn.training import compat
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    payload = _array_pickle({'model': {'w': arr}, 'acc': np.float64(81.2)}, module)

    # mmlinattn's restricted unpickler (the authors' files)
    unpickler = _RestrictedUnpickler(io.BytesIO(payload))
    loaded = unpickler.load()
    assert not unpickler.replaced, unpickler.replaced
    np.testing.assert_array_equal(loaded['model']['w'], arr)

    path = tmp_path / 'ckpt.pth'
    path.write_bytes(_torch_file(payload))
    # torch's loader as mmengine calls it (torch.load without weights_only): weights-only where
    # this torch loads so by default (2.6 and later; the fix allows numpy), a full unpickle before
    weights_only = compat._torch_loads_weights_only_by_default()
    assert weights_only == (compat.STATUS['numpy_globals'] is True)
    if (module == 'numpy._core.multiarray' and not weights_only
            and importlib.util.find_spec('numpy._core') is None):
        # numpy < 1.26 (the stock torch 2.1 stack has 1.24) has no numpy._core: torch's full
        # unpickle cannot import numpy 2's name there - a gap of torch + numpy, not closed here
        with pytest.raises(ModuleNotFoundError, match='numpy._core'):
            torch.load(path)
    else:
        loaded = torch.load(path)
        assert isinstance(loaded['model']['w'], np.ndarray) and loaded['acc'] == np.float64(81.2)
        np.testing.assert_array_equal(loaded['model']['w'], arr)
    # and our reader, on any torch (torch 2.1's weights-only loader knows no numpy: ours does)
    assert read_checkpoint(str(path))['acc'] == np.float64(81.2)
