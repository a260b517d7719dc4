"""Issue 5: a short toy run learns (beats the untrained model) and tools/test.py reproduces the
metrics logged at the end of training."""
import json
import os.path as osp
import re
import subprocess
import sys

import pytest

from tools.misc import make_toy_datasets as toy

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')


def _scalars(work_dir):
    import glob
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    rows = [json.loads(line) for line in open(files[-1])]
    return [r for r in rows if 'mIoU' in r]


@pytest.mark.slow
def test_short_training_beats_untrained_and_test_reproduces_metrics(tmp_path):
    data = tmp_path / 'toy_ade'
    toy.make_toy_ade(str(data), seed=7, train=24, val=6, size=128)
    opts = [f'train_dataloader.dataset.data_root={data}', f'val_dataloader.dataset.data_root={data}',
            f'test_dataloader.dataset.data_root={data}', 'train_dataloader.batch_size=4',
            'train_cfg.max_iters=60', 'train_cfg.val_interval=60',
            'param_scheduler.1.end=60', 'default_hooks.checkpoint.interval=60']
    def tool(*args):  # separate processes, as users run them (mmengine's logger/visualizer are
        # process-wide singletons)
        r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout

    # the untrained model (lr 0 for one iteration), evaluated through the same loop
    work0 = tmp_path / 'untrained'
    tool('tools/train.py', SEG_CFG, '--work-dir', str(work0), '--cfg-options', *opts,
         'train_cfg.max_iters=1', 'train_cfg.val_interval=1', 'optim_wrapper.optimizer.lr=0.0')
    untrained = _scalars(str(work0))[-1]['mIoU']

    work = tmp_path / 'trained'
    tool('tools/train.py', SEG_CFG, '--work-dir', str(work), '--cfg-options', *opts)
    logged = _scalars(str(work))[-1]['mIoU']
    assert logged > untrained + 15, (untrained, logged)

    out = tool('tools/test.py', SEG_CFG, str(work / 'iter_60.pth'), '--work-dir',
               str(tmp_path / 'test'), '--cfg-options', *opts)
    tested = float(re.findall(r"'mIoU': (?:np\.float32\()?([0-9.]+)", out)[-1])
    assert tested == pytest.approx(logged, abs=1e-2)
