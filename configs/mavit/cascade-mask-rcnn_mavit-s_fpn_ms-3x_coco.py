# cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco: MAViT-S (small; MALA has no T Cascade); the B and L
#   configs inherit it.
# Recipe: qhfan/MALA detect/configs/MALA/casrcnn_s_3x.py.
# Deviations from it: none.
_base_ = ['../_base_/models/cascade-mask-rcnn_fpn_4conv1fc-giou.py',
          '../_base_/datasets/coco_instance_ms-3x.py', '../_base_/schedules/schedule_3x.py',
          '../_base_/default_runtime_det.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='MAViT', arch='small', drop_path_rate=0.15, out_indices=(0, 1, 2, 3),
        # the stem's and the downsampling layers' BatchNorm, synchronised across the GPUs
        conv_norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_S.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

# no weight decay on parameters whose names contain these keys, as the source lists them
# and weight decay x 0.0 on every normalisation layer (the heads' BN too)
optim_wrapper = dict(optimizer=dict(lr=0.0004, weight_decay=0.05), paramwise_cfg=dict(
    norm_decay_mult=0.0,
    custom_keys={
        'absolute_pos_embed': dict(decay_mult=0.),
        'relative_position_bias_table': dict(decay_mult=0.),
        'rpe_table': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))
# precision: the source trained in mixed precision with a dynamic loss scale, as --amp does
# on a GPU; fp32 without --amp
amp_loss_scale = 'dynamic'
