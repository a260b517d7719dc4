# 80k iterations, poly decay (power 0.9) to a minimum lr of 1e-6 (MALA's Semantic FPN; PVT's configs
# decay to 0 and set their own param_scheduler), no warmup, AdamW, every parameter decays.
_base_ = 'mmseg::_base_/schedules/schedule_80k.py'
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.0001),
    clip_grad=None)
param_scheduler = [
    dict(type='PolyLR', eta_min=1e-6, power=0.9, begin=0, end=80000, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=80000, val_interval=8000)
# Learning rates are for 16 images per iteration (8 GPUs x 2, as in the papers); auto_scale_lr
# rescales them linearly to the real total batch (GPUs x train_dataloader.batch_size).
auto_scale_lr = dict(enable=True, base_batch_size=16)
# mmseg's CheckpointHook settings, written by SafeCheckpointHook (atomic, rotation after the save)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))
