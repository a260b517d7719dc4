# 12 epochs, lr x0.1 at epochs 8 and 11, linear warmup over 500 iterations from 0.001 x lr, AdamW
# (betas 0.9 / 0.999). lr, weight decay and the no-decay rules (paramwise_cfg) come from each
# config's source and are written in the config itself; with none, every parameter decays.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0004, betas=(0.9, 0.999), weight_decay=0.05))
# Learning rates are for 16 images per iteration (8 GPUs x 2, as in the papers); auto_scale_lr
# rescales them linearly to the real total batch (GPUs x train_dataloader.batch_size).
auto_scale_lr = dict(enable=True, base_batch_size=16)
