# ImageNet-1k evaluation of the authors' classifiers under mmpretrain (224x224, bicubic resize 256
# -> center crop 224 as the authors). Weights: convert the authors' file first,
#   python tools/model_converters/convert_authors_checkpoint.py FAMILY ARCH SRC DST --classifier
# and pass it as the checkpoint of tools/test.py.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    '../_base_/default_runtime_cls.py',
]
