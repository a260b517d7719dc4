# mmdet's runtime + what makes a run of ours safe and clear under any tool that runs the config
# (ours, mmdet's own tools/train.py and test.py, mim train / mim test): docs/design.md, "One run".
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
# mmlinattn.training.runner.LinAttnRunner: the pre-flight before any data is read, the work-dir
# lock, --resume from the newest intact checkpoint, the checkpoint checked against the model
# (fit, trained-as attention), the hooks below, one-line errors
runner_type = 'LinAttnRunner'
# SafeCheckpointHook: mmengine's CheckpointHook with atomic writes and rotation after the save
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=3))
# the hooks every run of ours has, under any tool (a child config that writes its own custom_hooks
# list gets those it drops put back by LinAttnRunner, with one log line):
# - NonFiniteLossHook: a NaN/inf loss stops the run, no bad checkpoint (interval=0: off)
# - PreemptionHook: these signals and Ctrl-C save a checkpoint, then stop; --resume goes on
#   (signals=[], ctrl_c=False: off)
# - RunChecksHook: where a tool builds mmengine's own Runner whatever runner_type says (mmseg
#   1.2.2's test.py), the checkpoint's checks before its weights are loaded, and one line naming
#   what that Runner leaves off
custom_hooks = [
    dict(type='NonFiniteLossHook'),
    dict(type='PreemptionHook', signals=['SIGTERM', 'SIGUSR1']),
    dict(type='RunChecksHook'),
]
