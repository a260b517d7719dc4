# Mask R-CNN with MAViT-T on your own COCO-format instance set (docs/custom_dataset.md):
# 5 classes, images of any size, a few hundred training images, 1 GPU x 2 images.
_base_ = '../mavit/mask-rcnn_mavit-t_fpn_1x_coco.py'

data_root = 'data/my_coco/'
metainfo = dict(
    classes=('crack', 'dent', 'scratch', 'rust', 'hole'),  # the "name"s of the json's categories
    palette=[(220, 20, 60), (0, 0, 142), (0, 160, 80), (250, 170, 30), (106, 0, 228)])
num_classes = len(metainfo['classes'])

# every head that classifies: the box head and the mask head
model = dict(roi_head=dict(bbox_head=dict(num_classes=num_classes),
                           mask_head=dict(num_classes=num_classes)))

# images of any size and aspect ratio are resized to fit img_scale, keeping their aspect ratio
img_scale = (1333, 800)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
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
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# a small set: more epochs than COCO's 12, a warm-up shorter than one epoch's iterations
max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=4)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[16, 22],
         gamma=0.1),
]
default_hooks = dict(checkpoint=dict(interval=4, max_keep_ckpts=2))
# The lr of the base (4e-4) is for 16 images per iteration; auto_scale_lr (on) multiplies it by
# (GPUs x train_dataloader.batch_size) / 16 at start-up: 1 GPU x 2 images -> 5e-5.
auto_scale_lr = dict(enable=True, base_batch_size=16)

# Backbone: the authors' ImageNet weights (init_cfg of the base: checkpoints/MAViT_T.pth).
# Or start from a whole detector trained on COCO (80 classes): set load_from and train with
# `tools/train.py CONFIG --partial-load`, which loads every weight that fits and re-initialises
# the class-specific layers of the heads.
# load_from = 'work_dirs/mask-rcnn_mavit-t_fpn_1x_coco/epoch_12.pth'
