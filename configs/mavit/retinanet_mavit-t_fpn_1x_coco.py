# retinanet_mavit-t_fpn_1x_coco: MAViT-T (tiny); the S, B and L configs inherit it.
# Recipe: qhfan/MALA detect/configs/MALA/retinanet_t_1x.py.
# Deviations from it: none.
_base_ = ['../_base_/models/retinanet_fpn.py', '../_base_/datasets/coco_detection.py',
          '../_base_/schedules/schedule_1x.py', '../_base_/default_runtime_det.py']

# RetinaNet's FPN starts at stage 2: the backbone returns only the stages it reads (as mmdet's Swin
# RetinaNet), so no output norm is left without a gradient under DDP
model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='MAViT', arch='tiny', drop_path_rate=0.1, out_indices=(1, 2, 3),
        # the stem's and the downsampling layers' BatchNorm, synchronised across the GPUs
        conv_norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_T.pth')),
    neck=dict(in_channels=[128, 256, 512], start_level=0))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(optimizer=dict(lr=0.0004, weight_decay=0.0001))
# precision: the source trained in fp16 with a static loss scale of 512; on a GPU:
#   --amp --cfg-options optim_wrapper.loss_scale=512.  (--amp alone scales dynamically;
#   fp32 without --amp)
amp_loss_scale = 512.0
