# upernet_mavit-t_160k_ade20k-512x512: MAViT-T (tiny); the S, B and L configs inherit it.
# Recipe: qhfan/MALA segmentation/configs/MALA/Uper_t_2x.py.
# Deviations from it: none.
_base_ = ['../_base_/models/upernet_ade20k.py', '../_base_/datasets/ade20k_512x512.py',
          '../_base_/schedules/schedule_160k.py', '../_base_/default_runtime_seg.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='MAViT', arch='tiny', drop_path_rate=0.1, out_indices=(0, 1, 2, 3),
        # the stem's and the downsampling layers' BatchNorm, synchronised across the GPUs
        conv_norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_T.pth')),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))

# no weight decay on parameters whose names contain these keys, as the source lists them
optim_wrapper = dict(optimizer=dict(lr=6e-05, weight_decay=0.01), paramwise_cfg=dict(custom_keys={
    'absolute_pos_embed': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'norm': dict(decay_mult=0.)}))
# precision: the source trained in fp16 with a static loss scale of 512; on a GPU:
#   --amp --cfg-options optim_wrapper.loss_scale=512.  (--amp alone scales dynamically;
#   fp32 without --amp)
amp_loss_scale = 512.0
