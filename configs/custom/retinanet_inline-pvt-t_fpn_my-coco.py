# RetinaNet with InLine-PVT-T on your own COCO-format box set (docs/custom_dataset.md):
# 5 classes, images of any size, a few hundred training images, 1 GPU x 2 images.
_base_ = '../inline_pvt/retinanet_inline-pvt-t_fpn_1x_coco.py'

data_root = 'data/my_coco/'
metainfo = dict(
    classes=('crack', 'dent', 'scratch', 'rust', 'hole'),
    palette=[(220, 20, 60), (0, 0, 142), (0, 160, 80), (250, 170, 30), (106, 0, 228)])

# RetinaNet's head is sigmoid-based: num_classes is the number of classes (no background class)
model = dict(bbox_head=dict(num_classes=len(metainfo['classes'])))

img_scale = (1333, 800)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                          'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=2,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=2,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', metric='bbox')
test_evaluator = val_evaluator

max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=4)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[16, 22],
         gamma=0.1),
]
default_hooks = dict(checkpoint=dict(interval=4, max_keep_ckpts=2))
auto_scale_lr = dict(enable=True, base_batch_size=16)  # lr 1e-4 for 16 images -> 1.25e-5 for 2
