# retinanet_inline-swin-t_fpn_1x_coco: InLineSwin-T (tiny).
# Recipe: our choice (no setting in the paper), following open-mmlab/mmdetection
#   configs/swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = ['../_base_/models/retinanet_fpn.py', '../_base_/datasets/coco_detection.py',
          '../_base_/schedules/schedule_1x.py', '../_base_/default_runtime_det.py']

# RetinaNet's FPN starts at stage 2: the backbone returns only the stages it reads (as mmdet's Swin
# RetinaNet), so no output norm is left without a gradient under DDP
model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLineSwin', arch='tiny', drop_path_rate=0.2, out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_t.pth')),
    neck=dict(in_channels=[192, 384, 768], start_level=0))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001))
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
