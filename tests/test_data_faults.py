"""Every data fault names its file before or at its first use: an image listed in a COCO file but
missing (pre-flight, before the model is built), a label map that is truncated or missing (the
pre-flight label check reports it), and an image truncated on disk (named when a sample first loads
it, from a data loader worker too), each through tools/train.py as one line with exit code 2. Data
made here (the generated toy sets, then damaged)."""
import copy
import json
import os
import os.path as osp

import pytest

from tools import train as train_tool

from helpers import make_toy_sets, work_dir_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
DET_CFG = osp.join(ROOT, 'configs/toy/mask-rcnn_mavit-t_fpn_toy-coco.py')


@pytest.fixture
def toy(tmp_path):
    return make_toy_sets(tmp_path / 'data', seed=5, size=48, train=4, val=2)


def truncate(path, keep=0.5):
    """Cut the file to a part of its bytes, as an interrupted copy would."""
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:int(len(data) * keep)])


def train(cfg, root, tmp_path, capsys, *extra):
    """tools/train.py for two iterations on the data under ``root``; (exit code, stderr lines,
    whether a work dir was made)."""
    sub = 'toy_ade' if cfg == SEG_CFG else 'toy_coco'
    work = tmp_path / 'work'
    options = [f'{k}_dataloader.dataset.data_root={root}/{sub}/' for k in ('train', 'val', 'test')]
    if cfg == DET_CFG:
        options.append(f'val_evaluator.ann_file={root}/toy_coco/annotations/instances_val.json')
        options += ['train_cfg.max_epochs=1']
    else:
        options += ['train_cfg.max_iters=2', 'train_cfg.val_interval=1000']
    capsys.readouterr()
    rc = train_tool.main([cfg, '--work-dir', str(work), '--cfg-options',
                          'train_dataloader.batch_size=2',
                          *options, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    # the tool's message, from its first line on (mmengine's logger may have written before it)
    start = [i for i, line in enumerate(err) if line.startswith('tools/train.py: error:')]
    return rc, err[start[-1]:] if start else err, work


def test_coco_image_listed_but_missing_is_named_before_the_model(toy, tmp_path, capsys):
    with open(toy / 'toy_coco/annotations/instances_train.json') as f:
        name = json.load(f)['images'][1]['file_name']
    os.remove(toy / 'toy_coco/train' / name)
    rc, err, work = train(DET_CFG, toy, tmp_path, capsys)
    assert rc == 2 and len(err) == 1, err
    assert '1 of 4 image(s) listed in "images" are not in' in err[0]
    assert 'train_dataloader.dataset.data_prefix.img' in err[0] and name in err[0]
    assert work_dir_files(work) == {}  # stopped before any data was read: a log folder only


@pytest.mark.parametrize('fault', ['truncated', 'missing'])
def test_label_map_that_cannot_be_read_is_reported_by_the_preflight(fault, toy, tmp_path, capsys):
    folder = toy / 'toy_ade/annotations/training'
    label = folder / sorted(os.listdir(folder))[2]
    truncate(label) if fault == 'truncated' else os.remove(label)
    rc, err, work = train(SEG_CFG, toy, tmp_path, capsys)
    assert rc == 2, err
    text = '\n'.join(err)
    assert text.startswith('tools/train.py: error: train_dataloader.dataset: 1 file(s) that cannot '
                           'be read'), text
    assert f'{label}: ' + ('OSError: image file is truncated' if fault == 'truncated' else
                           'file not found') in text
    assert work_dir_files(work) == {}


def test_truncated_image_is_named_at_its_first_use(toy, tmp_path, capsys):
    """The pre-flight reads image headers only; the truncated image fails where mmcv decodes it
    in a data loader worker, and the message names it (in the main process, the dataset's own
    error: test_other_pipeline_errors_pass_through_unchanged)."""
    folder = toy / 'toy_ade/images/training'
    for name in os.listdir(folder):  # every image: the first batch meets one
        # the header reads (the pre-flight's check), the pixels not
        truncate(folder / name, keep=0.8)
    rc, err, _ = train(SEG_CFG, toy, tmp_path, capsys, 'train_dataloader.num_workers=1')
    assert rc == 2, err[-20:]
    assert len(err) == 1 and err[0].startswith('tools/train.py: error: train_dataloader.dataset '
                                               '(BaseSegDataset, sample '), err[-20:]
    assert f'cannot read the image {folder}/' in err[0]
    assert 'OSError: image file is truncated' in err[0]


def test_other_pipeline_errors_pass_through_unchanged(toy):
    """Only a file that does not decode becomes a DataFileError: a pipeline bug on readable files
    keeps its own exception."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS, TRANSFORMS

    from mmlinattn.training.datafaults import DataFileError

    @TRANSFORMS.register_module(name='_BrokenForTest', force=True)
    class Broken:
        def __call__(self, results):
            raise ValueError('a bug in a transform')

    init_default_scope('mmseg')
    ds_cfg = dict(type='BaseSegDataset', data_root=str(toy / 'toy_ade'),
                  data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                  img_suffix='.jpg', seg_map_suffix='.png',
                  pipeline=[dict(type='LoadImageFromFile'), dict(type='_BrokenForTest')])
    ds = DATASETS.build(copy.deepcopy(ds_cfg))
    from mmlinattn.training.datafaults import name_unreadable_files_in
    plain = DATASETS.build(copy.deepcopy(ds_cfg))
    assert name_unreadable_files_in(ds) == 1  # what the runner of our tools does to its datasets
    with pytest.raises(ValueError, match='a bug in a transform'):
        ds[0]
    truncate(ds.get_data_info(0)['img_path'], keep=0.8)
    with pytest.raises(AssertionError, match='failed to load image'):
        plain[0]  # a dataset of nobody's tools: mmcv's own error, as without mmlinattn
    with pytest.raises(DataFileError, match=r'train_dataloader.dataset \(BaseSegDataset, sample '
                       r'0\): '
                                            r'cannot read the image .* image file is truncated'):
        ds[0]


def test_data_file_error_from_a_worker_reads_as_its_own_message():
    from mmlinattn.training.datafaults import DataFileError
    text = ('Caught DataFileError in DataLoader worker process 0.\nOriginal Traceback (most recent '
            'call last):\n  File "x.py", line 1, in f\n'
            'mmlinattn.training.datafaults.DataFileError: '
            'train_dataloader.dataset (X, sample 3): cannot read the image a.jpg: '
            'OSError: broken\n')
    assert str(DataFileError(text)) == ('train_dataloader.dataset (X, sample 3): cannot read the '
                                        'image a.jpg: OSError: broken')
    assert str(DataFileError('plain')) == 'plain'
