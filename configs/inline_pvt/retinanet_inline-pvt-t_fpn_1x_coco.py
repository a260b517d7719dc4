# retinanet_inline-pvt-t_fpn_1x_coco: InLinePVT-T (tiny); the S, M and L configs inherit it.
# Recipe: our choice (no setting in the paper), following whai362/PVT
#   detection/configs/retinanet_pvt_t_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = ['../_base_/models/retinanet_fpn.py', '../_base_/datasets/coco_detection.py',
          '../_base_/schedules/schedule_1x.py', '../_base_/default_runtime_det.py']

# RetinaNet's FPN starts at stage 2: the backbone returns only the stages it reads (as mmdet's Swin
# RetinaNet), so no output norm is left without a gradient under DDP
model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.1, out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_t.pth')),
    neck=dict(in_channels=[128, 320, 512], start_level=0))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(optimizer=dict(lr=0.0001, weight_decay=0.0001))
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
