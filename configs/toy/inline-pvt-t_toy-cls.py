# InLine-PVT-T pretrained as a classifier on the toy classification set (random init): global
# average pooling and a linear head, as the authors' ImageNet models.
_base_ = ['./_base_/toy_cls.py']
model = dict(
    type='ImageClassifier',
    backbone=dict(type='InLinePVT', arch='tiny', out_indices=(3,), drop_path_rate=0.0),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(type='LinearClsHead', num_classes=3, in_channels=512,
              loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))
