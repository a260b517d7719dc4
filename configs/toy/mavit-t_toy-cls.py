# MAViT-T pretrained as a classifier on the toy classification set (random init), with the authors'
# classification neck (Conv1x1 -> BN -> Swish -> pool) and a linear head, as their ImageNet models.
_base_ = ['./_base_/toy_cls.py']
model = dict(
    type='ImageClassifier',
    backbone=dict(type='MAViT', arch='tiny', out_indices=(3,), out_norm=False, drop_path_rate=0.0),
    neck=dict(type='MAViTClsNeck', in_channels=512, projection=2048),
    head=dict(type='LinearClsHead', num_classes=3, in_channels=2048,
              loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))
