# upernet_inline-swin-t_160k_ade20k-512x512: InLineSwin-T (tiny); the S and B configs inherit it.
# Recipe: SwinTransformer/Swin-Transformer-Semantic-Segmentation
#   configs/swin/upernet_swin_tiny_patch4_window7_512x512_160k_ade20k.py.
# Deviations from it: none.
_base_ = ['../_base_/models/upernet_ade20k.py', '../_base_/datasets/ade20k_512x512.py',
          '../_base_/schedules/schedule_160k.py', '../_base_/default_runtime_seg.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLineSwin', arch='tiny', drop_path_rate=0.3, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_t.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))

# no weight decay on parameters whose names contain these keys, as the source lists them
optim_wrapper = dict(optimizer=dict(lr=6e-05, weight_decay=0.01), paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.)}))
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
