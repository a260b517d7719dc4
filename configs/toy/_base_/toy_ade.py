# The generated toy ADE20K-layout data: label 0 = unlabelled (ignored through reduce_zero_label),
# 1 = background, 2-4 = circle / square / triangle. 128x128 images.
_base_ = '../../_base_/datasets/ade20k_512x512.py'
data_root = 'data/toy_ade'
metainfo = dict(classes=('background', 'circle', 'square', 'triangle'),
                palette=[[120, 120, 120], [220, 60, 50], [50, 170, 70], [60, 90, 220]])
crop_size = (128, 128)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(128, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
_dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
                img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(_dataset, data_prefix=dict(img_path='images/training',
                                            seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(_dataset, data_prefix=dict(img_path='images/validation',
                                            seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
