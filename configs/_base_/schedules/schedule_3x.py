# 36 epochs, lr x0.1 at epochs 27 and 33, warmup 500 iterations, AdamW (schedule_1x otherwise).
_base_ = './schedule_1x.py'
train_cfg = dict(max_epochs=36)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=36, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
