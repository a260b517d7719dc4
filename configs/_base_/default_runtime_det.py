# mmdet's runtime + our registration (custom_imports) for every detection config.
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3))
