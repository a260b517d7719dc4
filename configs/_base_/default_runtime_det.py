# mmdet's runtime + our registration and mmengine's fixes for torch >= 2.6 (custom_imports:
# mmlinattn.upstream_fixes) for every detection config.
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
# SafeCheckpointHook: mmengine's CheckpointHook with atomic writes and rotation after the save
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=3))
