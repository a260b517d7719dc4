# UperNet with MAViT-T on your own segmentation set in the ADE20K layout (docs/custom_dataset.md):
# 5 classes, label 0 = background is a class (reduce_zero_label=False), 1 GPU x 2 crops of 512x512.
_base_ = '../mavit/upernet_mavit-t_160k_ade20k-512x512.py'

data_root = 'data/my_seg/'
metainfo = dict(
    classes=('background', 'road', 'building', 'vegetation', 'water'),  # label values 0..4
    palette=[[0, 0, 0], [128, 64, 128], [70, 70, 70], [107, 142, 35], [0, 130, 180]])
num_classes = len(metainfo['classes'])
crop_size = (512, 512)

# UperNet has two heads that classify: the decode head and the auxiliary FCN head
model = dict(data_preprocessor=dict(size=crop_size),
             decode_head=dict(num_classes=num_classes),
             auxiliary_head=dict(num_classes=num_classes))

img_scale = (2048, 512)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomResize', scale=img_scale, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
               img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=False)
train_dataloader = dict(
    batch_size=2, num_workers=2,
    dataset=dict(dataset, data_prefix=dict(img_path='images/training',
                                           seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=2,
    dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                           seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

# a small set: 16k iterations instead of 160k, warm-up 500 iterations, then poly decay
max_iters = 16000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=2000)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=500, end=max_iters, by_epoch=False),
]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=2000, max_keep_ckpts=2))
auto_scale_lr = dict(enable=True, base_batch_size=16)  # lr 6e-5 for 16 images -> 7.5e-6 for 2
