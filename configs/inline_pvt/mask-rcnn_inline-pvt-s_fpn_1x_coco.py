# mask-rcnn_inline-pvt-s_fpn_1x_coco: InLinePVT-S (small), over the T config.
# Recipe: whai362/PVT detection/configs/mask_rcnn_pvt_s_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_s.pth')))
