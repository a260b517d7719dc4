# The generated toy classification set (tools/misc/make_toy_datasets.py --only cls): 3 shape
# classes, 64x64 images in mmpretrain's CustomDataset folder layout, and a short AdamW schedule for
# pretraining a backbone as a classifier on the CPU (docs/finetuning.md).
_base_ = ['../../_base_/default_runtime_cls.py']

data_root = 'data/toy_cls/'
data_preprocessor = dict(num_classes=3, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                         to_rgb=True)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=16, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=32, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='val',
                 pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1,))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=10)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=3e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0, end=10,
         convert_to_iter_based=True),
]
auto_scale_lr = dict(enable=False, base_batch_size=16)
default_hooks = dict(logger=dict(type='LoggerHook', interval=10),
                     checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=1))
randomness = dict(seed=0)
