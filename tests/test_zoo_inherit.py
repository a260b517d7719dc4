"""The zoo configs (``configs/{inline_pvt,inline_swin,mavit}/*.py``) inherit as mmdet's do: the
smallest model of each (family, detector or segmentor, schedule) - T, or S where the source has no
T (MAViT's 3x) - is written out over ``configs/_base_/``, and each larger one is that config
(``_base_ = './<it>.py'``) plus what differs (arch, drop path, checkpoint, channels, the source's
batch / lr / precision where they differ).

Inheriting changes how the configs are written, not what they mean: every config, merged, is what
it was at commit 6638814, when each was written out in full by a generator since removed
(``tests/data/zoo_configs_6638814.json``: ``Config.fromfile(path).to_dict()`` of that commit's
configs through :func:`to_json` below, keys sorted); a key whose value has changed on purpose since
is listed in :data:`ALLOWED` with its reason."""
import ast
import functools
import json
import os.path as osp
import re
from glob import glob

import pytest
from mmengine.config import Config

# mmengine's parsing of mmdet's / mmseg's metafiles (most of a config's load) is done once per run
# by tests/upstream_memo.py, which conftest.py imports for every test

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DUMP = osp.join(ROOT, 'tests', 'data', 'zoo_configs_6638814.json')
#: the zoo's families and their archs, smallest first (the arch letter in the config names)
ARCHS = {'inline_pvt': 'tsml', 'inline_swin': 'tsb', 'mavit': 'tsbl'}
CONFIGS = sorted(osp.relpath(p, ROOT) for fam in ARCHS
                 for p in glob(osp.join(ROOT, 'configs', fam, '*.py')))
#: where the smallest model is not T: MALA released no T config of its 3x schedules
NOT_T = {'configs/mavit/mask-rcnn_mavit-s_fpn_ms-3x_coco.py',
         'configs/mavit/cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco.py'}
#: top-level key -> why its value differs from the 6638814 dump in every config. Only keys that
#: the runtime bases (configs/_base_/default_runtime_{det,seg}.py) hold: a config passes where its
#: value is its runtime base's (absent where that has none), so a zoo config cannot change them.
_HOOKS = ("the runtime's NonFiniteLossHook / PreemptionHook settings became custom_hooks entries "
          'of the runtime bases after 6638814')
ALLOWED = {'check_non_finite': _HOOKS, 'preemption_signals': _HOOKS, 'custom_hooks': _HOOKS}
#: dotted key -> (value at 6638814, value now, why): a change of one value in every config that has
#: the key. The segmentors are mmseg's EncoderDecoder with the large-image post-processing as the
#: model's own (it was applied by LinAttnRunner's constructor, which a plain Runner skips)
RENAMED = {'model.type': ('EncoderDecoder', 'LinAttnEncoderDecoder',
                          'the segmentor with the banded large-image post-processing')}


def to_json(value):
    """A merged config as JSON, one way only: a tuple becomes ``{'__tuple__': [items]}`` (so that
    ``out_indices=(1, 2, 3)`` and ``[1, 2, 3]`` stay different), a dict or list keeps its form, a
    str / int / float / bool / None is itself; anything else (and a dict key that is not a str)
    raises, rather than be written in some lossy form."""
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(f'non-str keys {bad!r}')
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {'__tuple__': [to_json(v) for v in value]}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f'{type(value).__name__} is not a config value the dump knows: {value!r}')


def merged(rel):
    """The config at ``rel`` (relative to the repository), merged over its bases, as JSON."""
    return to_json(Config.fromfile(osp.join(ROOT, rel)).to_dict())


def differences(old, new, key=''):
    """Dotted keys (``model.backbone.arch``, ``param_scheduler[1].end``) where ``new`` differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in (differences(old[k], new[k], f'{key}.{k}'.lstrip('.'))
                          if k in old and k in new else [f'{key}.{k}'.lstrip('.')])]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new))
                for d in differences(a, b, f'{key}[{i}]')]
    return [] if (type(old), old) == (type(new), new) else [key]


@functools.lru_cache(maxsize=None)
def dumped():
    with open(DUMP) as f:
        return json.load(f)


def parts(rel):
    """``configs/mavit/mask-rcnn_mavit-s_fpn_ms-3x_coco.py`` -> ((family, 'mask-rcnn',
    'fpn_ms-3x_coco'), 's'): the (detector, schedule) group and the arch letter."""
    family, name = rel.split('/')[1], osp.basename(rel)[:-3]
    model, backbone, rest = name.split('_', 2)
    prefix, arch = backbone.rsplit('-', 1)
    assert prefix == family.replace('_', '-'), rel
    return (family, model, rest), arch


def anchor_of(rel):
    """The config of the group's smallest arch."""
    group, _ = parts(rel)
    return min((c for c in CONFIGS if parts(c)[0] == group),
               key=lambda c: ARCHS[group[0]].index(parts(c)[1]))


def base_of(rel):
    """The ``_base_`` of the config's text (a literal)."""
    with open(osp.join(ROOT, rel)) as f:
        tree = ast.parse(f.read())
    found = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
             and [getattr(t, 'id', None) for t in node.targets] == ['_base_']]
    assert len(found) == 1, f'{rel}: {len(found)} _base_ assignments'
    return found[0]


def test_the_zoo_is_the_dumped_set_of_configs():
    """No config missing, none added since the dump (a new one: dump it and say so here)."""
    assert CONFIGS == sorted(dumped())
    assert len(CONFIGS) == 47


@functools.lru_cache(maxsize=None)
def runtime(kind):
    return merged(f'configs/_base_/default_runtime_{kind}.py')


@pytest.mark.parametrize('rel', CONFIGS, ids=lambda r: osp.basename(r)[:-3])
def test_merged_config_is_the_dumped_one(rel):
    new = merged(rel)
    # the dump's own encoding: a second pass changes nothing
    assert json.loads(json.dumps(new, sort_keys=True)) == new
    old = dumped()[rel]
    changed = [k for k in differences(old, new) if re.split(r'[.\[]', k)[0] not in ALLOWED and
               not (k in RENAMED and (old['model']['type'], new['model']['type']) ==
                    RENAMED[k][:2])]
    assert not changed, f'{rel}: merged values differ from the 6638814 dump at {changed}'
    base = runtime('det' if rel.endswith('_coco.py') else 'seg')
    for key in ALLOWED:
        assert new.get(key, 'absent') == base.get(key, 'absent'), (rel, key)


@pytest.mark.parametrize('rel', CONFIGS, ids=lambda r: osp.basename(r)[:-3])
def test_each_config_inherits_its_group_smallest(rel):
    """The smallest arch of a (family, detector, schedule) stands on the shared ``configs/_base_``
    files alone; every other inherits it, from the same folder, and nothing else - so the larger
    configs cannot silently go back to being written out in full."""
    base, anchor = base_of(rel), anchor_of(rel)
    if rel == anchor:
        assert (parts(rel)[1] == 't') == (rel not in NOT_T), rel
        assert isinstance(base, list) and base, rel
        assert all(b.startswith('../_base_/') for b in base), base
    else:
        assert base == './' + osp.basename(anchor), (rel, base)


def test_the_groups():
    """What the grouping above finds, typed from the zoo's tables (docs/design.md section 4): 14
    configs written over the bases, 33 that inherit one of them."""
    anchors = {c for c in CONFIGS if anchor_of(c) == c}
    assert len(anchors) == 14 and len(CONFIGS) - len(anchors) == 33
    assert NOT_T <= anchors
