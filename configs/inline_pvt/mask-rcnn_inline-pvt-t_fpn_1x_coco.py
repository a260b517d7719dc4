# mask-rcnn_inline-pvt-t_fpn_1x_coco: InLinePVT-T (tiny); the S, M and L configs inherit it.
# Recipe: whai362/PVT detection/configs/mask_rcnn_pvt_t_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = ['../_base_/models/mask-rcnn_fpn.py', '../_base_/datasets/coco_instance.py',
          '../_base_/schedules/schedule_1x.py', '../_base_/default_runtime_det.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.1, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_t.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(optimizer=dict(lr=0.0002, weight_decay=0.0001))
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
