# A few minutes on a 2-core CPU: AdamW from scratch, short warmup, step decay near the end.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=6, val_interval=6)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', begin=0, end=6, by_epoch=True, milestones=[5], gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0002, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.), 'pos_embed': dict(decay_mult=0.),
                                    'relative_position_bias_table': dict(decay_mult=0.)}))
auto_scale_lr = dict(enable=False, base_batch_size=4)
