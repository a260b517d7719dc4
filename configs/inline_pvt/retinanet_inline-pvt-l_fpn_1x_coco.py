# retinanet_inline-pvt-l_fpn_1x_coco: InLinePVT-L (large), over the T config.
# Recipe: our choice (no setting in the paper), following whai362/PVT
#   detection/configs/retinanet_pvt_l_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = './retinanet_inline-pvt-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_l.pth')))

# precision: the source trained in mixed precision with a dynamic loss scale, as --amp does
# on a GPU; fp32 without --amp
amp_loss_scale = 'dynamic'
