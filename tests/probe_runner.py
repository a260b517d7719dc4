"""A test-only probe of what a tool hands our Runner (tests/test_tools_build_our_runner.py).

A tool run with ``--cfg-options runner_type=probe_runner.ProbeRunner`` (this folder on the
process's ``PYTHONPATH``; mmengine's registries import a dotted ``type`` they do not hold) builds
:class:`ProbeRunner`, a :class:`LinAttnRunner` built by LinAttnRunner's own ``from_cfg``. When
the tool starts the run (``train()`` / ``val()`` / ``test()``), it writes what it got into the JSON
file named by ``PROBE_RUNNER_OUT`` and exits 0: before any dataloader is built or any check of
the data runs. Where a tool builds mmengine's plain Runner whatever ``runner_type`` says (mmseg
1.2.2's test.py), :class:`ProbeHook` in ``custom_hooks`` records at ``before_run`` instead, after
the hooks of higher priority (our RunChecksHook) ran."""
import json
import os
import sys

from mmengine.hooks import Hook

from mmlinattn.training.runner import LinAttnRunner

OUT = 'PROBE_RUNNER_OUT'
#: set: the probe refuses the run as our checks do (one line, exit 2) instead of recording it
REFUSE = 'PROBE_RUNNER_REFUSE'
#: the config's keys recorded (those the tools' flags set)
KEYS = ('default_hooks', 'optim_wrapper', 'auto_scale_lr', 'visualizer', 'runner_type')


def record(runner, run: str) -> None:
    """What ``runner`` got from its tool, into ``$PROBE_RUNNER_OUT``; then exit 0 (or, with
    ``$PROBE_RUNNER_REFUSE``, refuse the run as a check of ours does)."""
    if os.environ.get(REFUSE):
        from mmlinattn.training.refusal import refuse
        raise refuse(ValueError(os.environ[REFUSE]))
    cfg = runner.cfg
    got = dict(run=run, runner=[c.__name__ for c in type(runner).__mro__],
               hooks=[type(h).__name__ for h in runner.hooks], work_dir=runner.work_dir,
               launcher=runner.launcher, load_from=cfg.get('load_from'),
               resume=cfg.get('resume'), cfg={k: cfg.get(k) for k in KEYS},
               package=sys.modules['mmlinattn'].__file__)
    with open(os.environ[OUT], 'w') as f:
        json.dump(got, f, default=repr)
    raise SystemExit(0)


class ProbeRunner(LinAttnRunner):
    def train(self):
        record(self, 'train')

    def val(self):
        record(self, 'val')

    def test(self):
        record(self, 'test')


class ProbeHook(Hook):
    priority = 'LOWEST'

    def before_run(self, runner) -> None:
        record(runner, 'before_run')
