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
# a tool that builds mmengine's plain Runner whatever runner_type says (mmseg 1.2.2's test.py):
# the checkpoint's checks before its weights are loaded, one line
custom_hooks = [dict(type='RunChecksHook')]
