# 160k iterations, linear warmup 1500 iterations then poly (power 1.0) to 0, AdamW lr 6e-5 wd 0.01
# with no decay on norms and position tables (Swin/MALA UperNet recipe).
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'norm': dict(decay_mult=0.),
        'pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
# Learning rates are for 16 images per iteration (8 GPUs x 2, as in the papers); auto_scale_lr
# rescales them linearly to the real total batch (GPUs x train_dataloader.batch_size).
auto_scale_lr = dict(enable=True, base_batch_size=16)
