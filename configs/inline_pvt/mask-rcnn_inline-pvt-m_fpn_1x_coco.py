# mask-rcnn_inline-pvt-m_fpn_1x_coco: InLinePVT-M (medium), over the T config.
# Recipe: whai362/PVT detection/configs/mask_rcnn_pvt_m_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='medium', drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_m.pth')))
