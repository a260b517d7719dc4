# ImageNet-1k evaluation of the authors' classifiers under mmpretrain (224x224, bicubic resize 256
# -> center crop 224 as the authors). Weights: convert the authors' file first,
#   python tools/model_converters/convert_authors_checkpoint.py FAMILY ARCH SRC DST --classifier
# and pass it as the checkpoint of tools/test.py.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
# mmpretrain's CheckpointHook settings, written by SafeCheckpointHook (atomic, rotation after
# the save)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))
