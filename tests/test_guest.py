"""mmlinattn as a guest in the user's own stack: it runs on the torch mmdet users have, registers
our modules the OpenMMLab way and changes nothing else in the process. Each check runs in a fresh
interpreter (a subprocess), where what was there before ``import mmlinattn`` can be seen."""
import json
import os
import os.path as osp
import subprocess
import sys
import textwrap

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def run_python(code, timeout=300, env=None):
    """``code`` in a fresh interpreter (cwd: the repository); its last stdout line, as JSON."""
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------- older torch
def test_backbones_run_where_torch_compiler_lacks_the_probes():
    """torch 2.1 / 2.2 have no ``torch.compiler.is_compiling`` and torch < 2.5 no
    ``is_exporting``; every family's forward asked for both and failed with AttributeError there.
    Here they are removed before mmlinattn is imported (what such a torch looks like to us), and
    every family trains (forward + backward) and infers."""
    out = run_python('''
        import json, torch
        removed = [n for n in ('is_compiling', 'is_exporting') if hasattr(torch.compiler, n)]
        for name in removed:
            delattr(torch.compiler, name)
        if 'is_compiling' in removed:
            # torch 2.1's own flag: a plain function that dynamo replaces while it traces (today's
            # torch keeps a deprecated alias of torch.compiler.is_compiling under this name)
            torch._utils.is_compiling = lambda: False
        from mmlinattn.core.families import FAMILIES
        done = []
        for family, row in FAMILIES.items():
            m = row.backbone(arch='tiny')
            x = torch.randn(1, 3, 64, 64)
            m.train()
            sum(o.mean() for o in m(x)).backward()
            m.eval()
            with torch.no_grad():
                done.append([family, [list(o.shape) for o in m(x)]])
        print(json.dumps(done))
    ''')
    assert [f for f, _ in out] == ['inline_pvt', 'inline_swin', 'mavit']
    assert all(len(shapes) == 4 for _, shapes in out)


# ----------------------------------------------------------------------------------- registration
@pytest.mark.parametrize('order', ['before', 'after', 'never'])
def test_backbones_build_from_every_toolbox_whatever_the_import_order(order):
    """``import mmdet.registry`` / ``mmseg.registry`` / ``mmpretrain.registry`` before mmlinattn,
    after it, or not at all: our backbones build from each toolbox's MODELS (through mmengine's
    root registry, no import hook), and sys.meta_path is what it was before our import."""
    out = run_python(f'''
        import importlib, json, sys
        toolboxes = ('mmdet', 'mmseg', 'mmpretrain')
        if {order!r} == 'before':
            for t in toolboxes:
                importlib.import_module(t + '.registry')
        finders = [type(f).__qualname__ for f in sys.meta_path]
        import mmlinattn
        after_import = [type(f).__qualname__ for f in sys.meta_path]
        built = []
        if {order!r} != 'never':
            for t in toolboxes:
                reg = importlib.import_module(t + '.registry')
                from mmengine.registry import DefaultScope
                with DefaultScope.overwrite_default_scope(t):
                    m = reg.MODELS.build(dict(type='MAViT', arch='tiny'))
                built.append(type(m).__name__)
        else:
            from mmengine.registry import MODELS
            built.append(type(MODELS.build(dict(type='MAViT', arch='tiny'))).__name__)
        print(json.dumps(dict(finders=finders, after=after_import, built=built,
                              loaded=sorted(t for t in toolboxes if t in sys.modules))))
    ''')
    assert out['after'] == out['finders']
    assert out['built'] == ['MAViT'] * (1 if order == 'never' else 3)
    if order == 'never':
        assert out['loaded'] == []  # nothing of the toolboxes was imported by us


def test_reloading_our_registry_then_importing_a_toolbox():
    """A notebook's autoreload (``importlib.reload``) of our registry module, then the toolboxes'
    registries: was a RecursionError (a second import finder calling the first)."""
    out = run_python('''
        import importlib, json, sys
        import mmlinattn.core.registry
        importlib.reload(mmlinattn.core.registry)
        importlib.reload(mmlinattn.core.registry)
        import mmseg.registry, mmdet.registry
        from mmengine.registry import MODELS
        print(json.dumps([type(MODELS.build(dict(type='InLineSwin', arch='tiny'))).__name__,
                          len(sys.meta_path)]))
    ''')
    assert out[0] == 'InLineSwin'


class _BuildsInWorker:
    """A dataset whose items are built by our backbone registry in the worker process."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        from mmengine.registry import MODELS

        import mmlinattn  # noqa: F401
        m = MODELS.build(dict(type='InLinePVT', arch='tiny'))
        return sum(p.numel() for p in m.parameters())


def test_dataloader_workers_under_spawn():
    """Data loader workers started with ``spawn`` (macOS' and Windows' default, and CUDA users'
    choice) import mmlinattn afresh and build our modules there."""
    import torch
    loader = torch.utils.data.DataLoader(_BuildsInWorker(), batch_size=1, num_workers=1,
                                         multiprocessing_context='spawn')
    counts = [int(b) for b in loader]
    assert len(counts) == 2 and counts[0] == counts[1] > 1_000_000


# ------------------------------------------------------------------ nothing changed by the import
SNAPSHOT = '''
    import importlib, json, sys, warnings
    import torch, torch.serialization, numpy
    MODULES = ['torch', 'torch.serialization', 'torch.nn.functional', 'numpy',
               'mmengine.hooks.checkpoint_hook', 'mmengine.hooks.hook',
               'mmengine.dataset.base_dataset', 'mmengine.dataset.utils',
               'mmengine.logging.history_buffer', 'mmengine.logging.logger',
               'mmengine.runner.runner', 'mmengine.runner.checkpoint', 'mmengine.runner.loops',
               'mmengine.config.config', 'mmengine.registry.registry', 'mmengine.fileio.io',
               'mmengine.model.wrappers.distributed', 'mmcv.transforms.loading']
    for name in MODULES + ['mmdet.registry', 'mmseg.registry', 'mmpretrain.registry']:
        importlib.import_module(name)

    def snapshot():
        out = {}
        for name in MODULES:
            mod = sys.modules[name]
            for attr, obj in list(vars(mod).items()):
                out[f'{name}.{attr}'] = id(obj)
                if isinstance(obj, type) and obj.__module__ == name:
                    for a, v in list(vars(obj).items()):
                        out[f'{name}.{attr}.{a}'] = id(v)
        # mmengine's checkpoint schemes, a registry like its others: each prefix's loader (a
        # scheme added is ours to add; one of mmengine's replaced is a change)
        from mmengine.runner.checkpoint import CheckpointLoader
        del out['mmengine.runner.checkpoint.CheckpointLoader._schemes']
        for prefix, loader in CheckpointLoader._schemes.items():
            out[f'scheme {prefix!r}'] = id(loader)
        allow = getattr(torch.serialization, 'get_safe_globals', lambda: [])()
        out['torch allow-list'] = sorted(map(repr, allow))
        out['sys.meta_path'] = [repr(f) for f in sys.meta_path]
        out['sys.path_hooks'] = [repr(f) for f in sys.path_hooks]
        out['warnings.filters'] = len(warnings.filters)
        out['torch threads'] = torch.get_num_threads()
        out['default dtype'] = str(torch.get_default_dtype())
        return out

    before = snapshot()
    IMPORT
    after = snapshot()
    changed = sorted(k for k in before if before[k] != after.get(k))
    print(json.dumps(dict(changed=changed, torch=torch.__version__, n=len(before))))
'''


def import_changes(statement, env=None):
    out = run_python(SNAPSHOT.replace('    IMPORT', '    ' + statement), env=env)
    assert out['n'] > 5000, out['n']  # the snapshot did see the modules
    return out['changed']


def test_import_mmlinattn_changes_nothing_it_does_not_own():
    """mmengine's, mmcv's, torch's and numpy's functions and classes, torch's weights-only
    allow-list, the import system and the warning filters are the same objects after ``import
    mmlinattn`` (its registrations go into mmengine's registries, which are ours to add to). On
    the old tree: CheckpointHook._save_checkpoint_with_step, BaseDataset.prepare_data,
    HistoryBuffer's pickling, runner.save_checkpoint, the allow-list and sys.meta_path."""
    assert import_changes('import mmlinattn; '
                          'import mmlinattn.core.models, mmlinattn.training.hooks') == []


def test_upstream_fixes_change_only_what_they_fix():
    """``mmlinattn.upstream_fixes`` (our tools, our configs' custom_imports) changes HistoryBuffer's
    pickling, torch's allow-list and mmengine's loader of local files (which then also reads a
    checkpoint an unpatched mmengine wrote), and only where torch loads weights-only by default;
    ``MMLINATTN_UPSTREAM_FIXES=0`` turns it off."""
    import io
    import pickle

    import torch

    buf = io.BytesIO()
    torch.save({'x': _NotAllowed()}, buf)
    buf.seek(0)
    try:
        torch.load(buf)
        weights_only_default = False
    except pickle.UnpicklingError:
        weights_only_default = True
    changed = import_changes('import mmlinattn.upstream_fixes')
    if weights_only_default:  # and the loader of local files ('' scheme): compat's local_loader
        assert changed == ['mmengine.logging.history_buffer.HistoryBuffer.__getstate__',
                           'mmengine.logging.history_buffer.HistoryBuffer.__setstate__',
                           "scheme ''", 'torch allow-list']
    else:
        assert changed == []
    assert import_changes('import mmlinattn.upstream_fixes',
                          env={'MMLINATTN_UPSTREAM_FIXES': '0'}) == []


class _NotAllowed:
    """A class no weights-only allow-list has."""
