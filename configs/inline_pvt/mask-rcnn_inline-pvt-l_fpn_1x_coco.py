# mask-rcnn_inline-pvt-l_fpn_1x_coco: InLinePVT-L (large), over the T config.
# Recipe: whai362/PVT detection/configs/mask_rcnn_pvt_l_fpn_1x_coco.py.
# Deviations from it: none.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.0,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_l.pth')))

# the source trains 1 image per GPU on 8 GPUs; lr is for that total batch of 8
optim_wrapper = dict(optimizer=dict(lr=0.0001429))  # the source's 2e-4 / 1.4
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
