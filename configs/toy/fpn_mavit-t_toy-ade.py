# Toy Semantic FPN with MAViT-T (random init) on the generated toy ADE20K-layout data.
_base_ = [
    '../_base_/models/fpn_ade20k.py', './_base_/toy_ade.py',
    './_base_/toy_schedule_seg.py', '../_base_/default_runtime_seg.py',
]
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(_delete_=True, type='MAViT', arch='tiny', drop_path_rate=0.0),
    neck=dict(in_channels=[64, 128, 256, 512]),
    decode_head=dict(num_classes=4))
