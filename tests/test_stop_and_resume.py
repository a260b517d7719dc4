"""A real training process (tools/train.py, the toy Semantic FPN with MAViT-T) stopped each way a
run stops, then resumed with ``--resume``: the resumed Runner starts at the iteration of the
checkpoint the stop left, with exactly its weights, optimizer moments and schedule.

- ``ctrl-c``: SIGINT to the process group, as a terminal sends it. The finished iteration is saved,
  the process exits with the shell's code for Ctrl-C (130) and prints no traceback.
- ``sigkill``: killed without warning (out of memory, a node lost). Nothing is written at the
  stop; ``--resume`` takes the last interval checkpoint.

Other stops have their own tests, for what is particular to them: a failed checkpoint write
(test_faults.py), a half-written file (test_bad_input.py), a scheduler's SIGTERM (exit 75,
``EX_TEMPFAIL``: requeue with ``--resume``) and its checkpoint against ``max_keep_ckpts``
(test_edges.py), a second Ctrl-C (test_edges.py), a non-finite loss
(test_faults.py), the ranks' vote on a stop under DDP (test_hook_cost.py).
"""
import os
import os.path as osp
import re
import signal
import sys
import time

import pytest
import torch

from mmlinattn.training.resume import latest_intact_checkpoint
from tools import train as train_tool

import warm
from helpers import assert_resumed_from, read_last_checkpoint, toy_seg_options, train_resumed

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'configs/toy/fpn_mavit-t_toy-ade.py')
MAX_ITERS = 200
#: how: (signal, the iteration whose log line triggers it, the checkpoint interval, exit code,
#: what the tool says it received)
STOPS = {
    'ctrl-c': (signal.SIGINT, 1, 1000, 128 + signal.SIGINT, 'SIGINT (Ctrl-C) received'),
    # after iteration 3 is logged, the interval checkpoint of iteration 2 is complete on disk (a
    # late kill may find iteration 4's: the last intact one is where --resume goes)
    'sigkill': (signal.SIGKILL, 3, 2, -signal.SIGKILL, None),
}


def _logged_iters(out):
    return [int(m) for m in re.findall(rf'Iter\(train\) \[\s*(\d+)/{MAX_ITERS}\]', out)]


@pytest.mark.slow  # 10-25 s per case on the 2-core machine: a training process, then a resume
@pytest.mark.parametrize('how', list(STOPS))
def test_a_stopped_run_resumes_where_its_checkpoint_is(how, toy_data, tmp_path):
    sig, trigger, interval, code, said = STOPS[how]
    work = tmp_path / 'work'
    opts = toy_seg_options(toy_data, f'default_hooks.checkpoint.interval={interval}')
    cmd = [sys.executable, osp.join(ROOT, 'tools/train.py'), SEG_CFG, '--work-dir', str(work),
           '--cfg-options', *opts, f'train_cfg.max_iters={MAX_ITERS}']
    # a session of its own: a terminal's Ctrl-C (and a scheduler's kill) reach the whole group
    proc = warm.start(cmd, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED='1'),
                      new_session=True)
    try:
        deadline = time.time() + 240
        while (f'Iter(train) [{trigger:>3}/{MAX_ITERS}]' not in proc.output()
               and proc.poll() is None and time.time() < deadline):
            time.sleep(0.02)
        os.killpg(proc.pid, sig)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:  # never leave a training running past the test
            proc.kill()
    out = proc.output()
    assert rc == code, out[-3000:]
    n = max(_logged_iters(out))
    assert trigger <= n < MAX_ITERS, out[-2000:]
    if said is None:  # nothing written at the stop: the last intact interval checkpoint
        last = latest_intact_checkpoint(str(work))
        n = int(re.search(r'iter_(\d+)\.pth$', last).group(1))
        assert n % interval == 0 and trigger - 1 <= n <= max(_logged_iters(out)), (n, out[-2000:])
    else:
        assert f'{said}: finished iteration {n}' in out, out[-2000:]
        assert 'Traceback' not in out and 'KeyboardInterrupt' not in out, out[-3000:]
        if how == 'ctrl-c':
            assert 'press Ctrl-C again' in out
    saved_path = work / f'iter_{n}.pth'
    assert read_last_checkpoint(work) == str(saved_path)
    # weights-only where torch can allow the Runner's message hub in (mmlinattn.upstream_fixes,
    # which tools/train.py imports, does); the oldest torch reads this run's own file in full
    saved = torch.load(saved_path, map_location='cpu',
                       weights_only=hasattr(torch.serialization, 'add_safe_globals'))
    assert saved['meta']['iter'] == n

    args = train_tool.parse_args([SEG_CFG, '--work-dir', str(work), '--resume', '--cfg-options',
                                  *opts, f'train_cfg.max_iters={n + 1}'])
    cfg = train_tool.build_cfg(args)
    cfg.experiment_name = f'resumed_after_{how}'
    runner, captured = train_resumed(cfg)
    assert captured['iter'] == n
    assert_resumed_from(captured, saved)
    assert runner.iter == n + 1
