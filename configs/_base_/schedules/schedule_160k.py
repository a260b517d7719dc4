# 160k iterations, linear warmup 1500 iterations from 1e-6 x lr, then poly (power 1.0) to 0; AdamW
# lr 6e-5 (betas 0.9 / 0.999) wd 0.01 (Swin's and MALA's UperNet recipe). The no-decay rules
# (paramwise_cfg) are written in each config, from its source.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
# Learning rates are for 16 images per iteration (8 GPUs x 2, as in the papers); auto_scale_lr
# rescales them linearly to the real total batch (GPUs x train_dataloader.batch_size).
auto_scale_lr = dict(enable=True, base_batch_size=16)
# mmseg's CheckpointHook settings, written by SafeCheckpointHook (atomic, rotation after the save)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))
