# retinanet_inline-pvt-m_fpn_1x_coco: InLinePVT-M (medium), over the T config.
# Recipe: our choice (no setting in the paper), following whai362/PVT
#   detection/configs/retinanet_pvt_m_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = './retinanet_inline-pvt-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='medium', drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_m.pth')))
