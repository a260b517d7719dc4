_base_ = './_base_.py'
model = dict(
    type='ImageClassifier',
    backbone=dict(type='MAViT', arch='tiny', out_indices=(3,), out_norm=False, drop_path_rate=0.1),
    neck=dict(type='MAViTClsNeck', in_channels=512, projection=2048),
    head=dict(type='LinearClsHead', num_classes=1000, in_channels=2048,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')))
