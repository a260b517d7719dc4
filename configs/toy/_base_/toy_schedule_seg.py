# Iteration-based, a few minutes on a 2-core CPU.
train_cfg = dict(type='IterBasedTrainLoop', max_iters=300, val_interval=300)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),
    dict(type='PolyLR', eta_min=1e-5, power=1.0, begin=40, end=300, by_epoch=False),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.), 'pos_embed': dict(decay_mult=0.),
                                    'relative_position_bias_table': dict(decay_mult=0.)}))
auto_scale_lr = dict(enable=False, base_batch_size=4)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook', by_epoch=False, interval=100,
                                     max_keep_ckpts=2),
                     logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False))
