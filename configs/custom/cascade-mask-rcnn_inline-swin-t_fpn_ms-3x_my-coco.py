# Cascade Mask R-CNN with InLine-Swin-T on your own COCO-format instance set
# (docs/custom_dataset.md): 5 classes, images of any size, multi-scale training, 1 GPU x 2 images.
_base_ = '../inline_swin/cascade-mask-rcnn_inline-swin-t_fpn_ms-3x_coco.py'

data_root = 'data/my_coco/'
metainfo = dict(
    classes=('crack', 'dent', 'scratch', 'rust', 'hole'),
    palette=[(220, 20, 60), (0, 0, 142), (0, 160, 80), (250, 170, 30), (106, 0, 228)])
num_classes = len(metainfo['classes'])

# Cascade classifies in three box heads and the mask head. The box heads are a list, and a list
# in a config replaces the base's list whole: all three are written out (the base's 4conv1fc GIoU
# heads, one box coder per stage), each with num_classes.
model = dict(roi_head=dict(
    bbox_head=[
        dict(type='ConvFCBBoxHead', num_shared_convs=4, num_shared_fcs=1, in_channels=256,
             conv_out_channels=256, fc_out_channels=1024, roi_feat_size=7,
             num_classes=num_classes,
             bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                             target_stds=stds),
             reg_class_agnostic=False, reg_decoded_bbox=True,
             norm_cfg=dict(type='SyncBN', requires_grad=True),
             loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
             loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
        for stds in ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067])
    ],
    mask_head=dict(num_classes=num_classes)))

# multi-scale training: the short side is drawn from 480..800 (long side <= 1333)
train_scales = [(1333, 480), (1333, 544), (1333, 608), (1333, 672), (1333, 736), (1333, 800)]
img_scale = (1333, 800)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomChoiceResize', scales=train_scales, keep_ratio=True),
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

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=6)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
default_hooks = dict(checkpoint=dict(interval=6, max_keep_ckpts=2))
auto_scale_lr = dict(enable=True, base_batch_size=16)  # lr 1e-4 for 16 images -> 1.25e-5 for 2
