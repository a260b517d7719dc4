# mask-rcnn_inline-swin-t_fpn_ms-3x_coco: InLineSwin-T (tiny); the S and B configs inherit it.
# Recipe: our choice (no setting in the paper), following
#   SwinTransformer/Swin-Transformer-Object-Detection
#   configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_3x_coco.py.
# Deviations from it: none.
_base_ = ['../_base_/models/mask-rcnn_fpn.py', '../_base_/datasets/coco_instance_ms-3x.py',
          '../_base_/schedules/schedule_3x.py', '../_base_/default_runtime_det.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLineSwin', arch='tiny', drop_path_rate=0.2, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_t.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))

# no weight decay on parameters whose names contain these keys, as the source lists them
optim_wrapper = dict(optimizer=dict(lr=0.0001, weight_decay=0.05), paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.)}))
# precision: the source trained in mixed precision with a dynamic loss scale, as --amp does
# on a GPU; fp32 without --amp
amp_loss_scale = 'dynamic'
