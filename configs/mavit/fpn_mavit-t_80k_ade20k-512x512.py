# fpn_mavit-t_80k_ade20k-512x512: MAViT-T (tiny); the S, B and L configs inherit it.
# Recipe: qhfan/MALA segmentation/configs/MALA/FPN_t_1x.py.
# Deviations from it: none.
_base_ = ['../_base_/models/fpn_ade20k.py', '../_base_/datasets/ade20k_512x512.py',
          '../_base_/schedules/schedule_80k.py', '../_base_/default_runtime_seg.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='MAViT', arch='tiny', drop_path_rate=0.1, out_indices=(0, 1, 2, 3),
        # the stem's and the downsampling layers' BatchNorm, synchronised across the GPUs
        conv_norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_T.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(optimizer=dict(lr=0.0001, weight_decay=0.0001))
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
