# Toy UperNet with InLine-Swin-T (random init) on the generated toy ADE20K-layout data.
_base_ = [
    '../_base_/models/upernet_ade20k.py', './_base_/toy_ade.py',
    './_base_/toy_schedule_seg.py', '../_base_/default_runtime_seg.py',
]
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(_delete_=True, type='InLineSwin', arch='tiny', drop_path_rate=0.0),
    decode_head=dict(in_channels=[96, 192, 384, 768], channels=128, num_classes=4),
    auxiliary_head=dict(in_channels=384, channels=64, num_classes=4))
