# mmpretrain's runtime + what makes a run of ours safe and clear under any tool that runs the
# config (ours, mmpretrain's own tools/train.py and test.py, mim train / mim test): docs/design.md,
# "One run".
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
# mmlinattn.training.runner.LinAttnRunner (see default_runtime_det.py)
runner_type = 'LinAttnRunner'
check_non_finite = True
preemption_signals = ['SIGTERM', 'SIGUSR1']
# mmpretrain's CheckpointHook settings, written by SafeCheckpointHook (atomic, rotation after
# the save)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))
