# mmseg's runtime + what makes a run of ours safe and clear under any tool that runs the config
# (ours, mmseg's own tools/train.py and test.py, mim train / mim test): docs/design.md, "One run".
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
# mmlinattn.training.runner.LinAttnRunner: the pre-flight before any data is read, the work-dir
# lock, --resume from the newest intact checkpoint, the checkpoint checked against the model
# (fit, trained-as attention), the hooks below, one-line errors
runner_type = 'LinAttnRunner'
# the Runner's hooks: NonFiniteLossHook (a NaN/inf loss stops the run, no bad checkpoint) and
# PreemptionHook (these signals and Ctrl-C save a checkpoint, then stop: --resume goes on)
check_non_finite = True
preemption_signals = ['SIGTERM', 'SIGUSR1']
# a tool that builds mmengine's plain Runner whatever runner_type says (mmseg 1.2.2's test.py):
# the checkpoint's checks before its weights are loaded, one line
custom_hooks = [dict(type='RunChecksHook')]
# (the schedules' CheckpointHook is written by SafeCheckpointHook: atomic, rotation after the save)
