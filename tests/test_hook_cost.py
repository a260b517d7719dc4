"""What our default hooks cost on the healthy path (docs/benchmarks.md, "Our hooks"): the non-finite
check reads the loss values mmengine has already copied to the host, reads no parameter, and
shares one all-reduce per iteration with the preemption check. Counted, not timed."""
import re
import types
import uuid

import pytest
import torch
from mmengine.hooks import RuntimeInfoHook
from mmengine.logging import MessageHub

from mmlinattn.training import hooks as H


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.reads = 0

    def named_parameters(self, *args, **kwargs):
        self.reads += 1
        return super().named_parameters(*args, **kwargs)


def _runner(hooks, it=0, tmp_path='.'):
    runner = types.SimpleNamespace(
        iter=it, epoch=0, max_iters=100, hooks=hooks, model=_Model(), work_dir=str(tmp_path),
        message_hub=MessageHub.get_instance(f'hook_cost_{uuid.uuid4().hex}'),
        train_loop=types.SimpleNamespace(max_iters=100), optim_wrapper=None)
    return runner


def _iteration(runner, outputs):
    """What mmengine does after a training step: every hook's after_train_iter in priority order
    (RuntimeInfoHook first: it copies the outputs to the message hub)."""
    for hook in runner.hooks:
        hook.after_train_iter(runner, 0, None, outputs)


def _two_ranks(monkeypatch, votes):
    """A run of two ranks whose collective is recorded (and answers with this rank's flags)."""
    import mmengine.dist
    monkeypatch.setattr(mmengine.dist, 'get_world_size', lambda *a, **k: 2)
    monkeypatch.setattr(H, '_any_rank_each', lambda flags: votes.append(list(flags)) or
                        [bool(f) for f in flags])


def test_the_healthy_path_reads_no_parameter_and_votes_once(monkeypatch, tmp_path):
    votes = []
    _two_ranks(monkeypatch, votes)
    check, pre = H.NonFiniteLossHook(), H.PreemptionHook(signals=(), ctrl_c=False)
    runner = _runner([RuntimeInfoHook(), check, pre], tmp_path=tmp_path)
    check.before_train(runner)
    for it in range(3):
        runner.iter = it
        _iteration(runner, {'loss': torch.tensor(1.5), 'loss_cls': torch.tensor(0.5),
                            'acc': torch.tensor(90.0)})
    assert runner.model.reads == 0  # no parameter read while the loss is finite
    assert votes == [[False, False]] * 3  # one vote per iteration, for both hooks


def test_a_signal_rides_on_the_non_finite_vote(monkeypatch, tmp_path):
    """The preemption flag set before the iteration's vote travels in it: the preemption hook reads
    the stored result and sends nothing more."""
    votes = []
    _two_ranks(monkeypatch, votes)
    check, pre = H.NonFiniteLossHook(), H.PreemptionHook(signals=(), ctrl_c=False)
    runner = _runner([RuntimeInfoHook(), check, pre], it=4, tmp_path=tmp_path)
    pre.received = 'SIGTERM'
    assert H.stop_vote(runner, 'non_finite', False) is False
    assert H.stop_vote(runner, 'preempted', False) is True  # the stored vote, not this flag
    assert votes == [[False, True]]
    runner.iter = 5
    assert H.stop_vote(runner, 'preempted', True) is True and len(votes) == 2


def test_in_one_process_each_hook_reads_its_own_flag_when_it_runs(monkeypatch, tmp_path):
    """No process group: no collective, and a signal that arrives after the non-finite check of an
    iteration still stops that iteration."""
    votes = []
    monkeypatch.setattr(H, '_any_rank_each', lambda flags: votes.append(flags) or flags)
    check, pre = H.NonFiniteLossHook(), H.PreemptionHook(signals=(), ctrl_c=False)
    runner = _runner([RuntimeInfoHook(), check, pre], it=4, tmp_path=tmp_path)
    assert H.stop_vote(runner, 'non_finite', False) is False
    pre.received = 'SIGTERM'
    assert H.stop_vote(runner, 'preempted', True) is True and votes == []


def test_a_non_finite_term_stops_with_its_name(tmp_path):
    check = H.NonFiniteLossHook()
    runner = _runner([RuntimeInfoHook(), check], it=6, tmp_path=tmp_path)
    check.before_train(runner)
    with pytest.raises(H.NonFiniteLossError, match=r'non-finite loss at iteration 7: '
                                                   r'loss=nan, loss_mask=nan'):
        _iteration(runner, {'loss': torch.tensor(float('nan')), 'loss_cls': torch.tensor(0.3),
                            'loss_mask': torch.tensor(float('nan'))})
    assert runner.model.reads == 1  # the parameters are read on the failing path only


def test_weights_broken_with_a_non_finite_loss_are_named_after_this_update(tmp_path):
    """The hook reads the weights after the iteration's step: a non-finite loss at iteration 7
    with non-finite weights names the update of iteration 7 (the one it saw them after), not the
    previous one, whose checkpoint may well be finite (lr=1e6: iter_1.pth finite, iteration 2's
    forward overflows and its step makes the weights NaN)."""
    check = H.NonFiniteLossHook()
    runner = _runner([RuntimeInfoHook(), check], it=6, tmp_path=tmp_path)
    check.before_train(runner)
    with torch.no_grad():
        runner.model.w[1] = float('inf')
    with pytest.raises(H.NonFiniteLossError) as e:
        _iteration(runner, {'loss': torch.tensor(float('inf'))})
    msg = str(e.value)
    assert re.search(r'non-finite loss at iteration 7: loss=inf; after the update of iteration 7, '
                     r'1 of 1 parameter tensors are non-finite, e.g. w', msg), msg
    assert 'iteration 6' not in msg and 'already' not in msg, msg


def test_without_runtime_info_the_tensors_themselves_are_checked(tmp_path):
    """A run whose hooks lack mmengine's RuntimeInfoHook (nothing copies the outputs to the hub):
    the check reads the tensors."""
    check = H.NonFiniteLossHook()
    runner = _runner([check], it=0, tmp_path=tmp_path)
    check.before_train(runner)
    with pytest.raises(H.NonFiniteLossError, match='loss=nan'):
        _iteration(runner, {'loss': torch.tensor(float('nan'))})


def test_a_checkpoint_with_broken_weights_is_refused_naming_them(tmp_path):
    check = H.NonFiniteLossHook()
    runner = _runner([check], it=2, tmp_path=tmp_path)
    state = {'backbone.a': torch.ones(2), 'backbone.b': torch.tensor([1.0, float('nan')])}
    with pytest.raises(H.NonFiniteLossError, match=r'non-finite weights after the update of '
                                                   r'iteration 3: 1 of 2 state-dict tensors, e.g. '
                                                   r'backbone\.b; the loss was finite'):
        check.before_save_checkpoint(runner, {'state_dict': state, 'meta': {'iter': 3}})


def test_a_config_that_runs_the_preemption_hook_first_still_stops_on_a_nan(monkeypatch, tmp_path):
    """PreemptionHook before NonFiniteLossHook (custom priorities): the first vote carried no real
    non-finite flag, so the non-finite check votes again instead of reading a stored False."""
    votes = []
    _two_ranks(monkeypatch, votes)
    check, pre = H.NonFiniteLossHook(), H.PreemptionHook(signals=(), ctrl_c=False)
    runner = _runner([RuntimeInfoHook(), pre, check], it=3, tmp_path=tmp_path)
    check.before_train(runner)
    with pytest.raises(H.NonFiniteLossError, match='loss=nan'):
        _iteration(runner, {'loss': torch.tensor(float('nan'))})
    assert votes == [[False, False], [True, False]]


def test_with_several_ranks_weights_are_checked_on_every_rank_before_a_save(monkeypatch,
                                                                          tmp_path):
    """Rank 0 alone writes checkpoints: broken weights with a finite loss must stop every rank
    before CheckpointHook, through the vote, at the iterations it saves - and only then."""
    from mmengine.hooks import CheckpointHook
    votes = []
    _two_ranks(monkeypatch, votes)
    check = H.NonFiniteLossHook()
    ckpt = CheckpointHook(interval=2, by_epoch=False)
    runner = _runner([RuntimeInfoHook(), check, ckpt], it=2, tmp_path=tmp_path)
    check.before_train(runner)
    with torch.no_grad():
        runner.model.w[0] = float('nan')
    for hook in (runner.hooks[0], check):  # iteration 3: no save, nothing read
        hook.after_train_iter(runner, 0, None, {'loss': torch.tensor(0.5)})
    assert runner.model.reads == 0 and votes == [[False, False]]
    runner.iter = 3  # iteration 4: the checkpoint hook saves after it
    match = r'non-finite weights after the update of iteration 4: 1 of 1 parameter tensors, e.g. w'
    with pytest.raises(H.NonFiniteLossError, match=match):
        for hook in (runner.hooks[0], check):
            hook.after_train_iter(runner, 0, None, {'loss': torch.tensor(0.5)})
    assert runner.model.reads == 1 and votes[-1] == [True, False]


def _vote(rank, port, out):
    import torch.distributed as dist

    from mmlinattn.training.runner import _any_rank_code
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    try:
        got = (H.rank_max([rank, 5 - rank, 0]), H._any_rank_each([rank == 1, False]),
               _any_rank_code(0 if rank == 0 else None), _any_rank_code(None),
               _any_rank_code(2 if rank == 0 else None))
        torch.save(got, f'{out}.{rank}')
    finally:
        dist.destroy_process_group()


def test_the_rank_votes_take_every_ranks_value(tmp_path):
    """The one all-reduce the stop conditions and the refusals share, over two real gloo ranks:
    the maximum of each value. A refusal on one rank stops both with its exit code (no rank goes
    on into the run to wait for the other in a collective): 0 (nothing left to train) counts, and
    so does rank 0's alone (the busy work dir: rank 0 alone takes the lock)."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    mp.start_processes(_vote, args=(port, str(tmp_path / 'votes')), nprocs=2, start_method='spawn')
    for rank in (0, 1):
        assert torch.load(tmp_path / f'votes.{rank}') == ([1, 5, 0], [True, False], 0, None, 2)
