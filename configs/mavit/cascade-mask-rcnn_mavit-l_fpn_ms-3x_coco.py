# cascade-mask-rcnn_mavit-l_fpn_ms-3x_coco: MAViT-L (large), over the S config.
# Recipe: qhfan/MALA detect/configs/MALA/casrcnn_l_3x.py.
# Deviations from it: none.
_base_ = './cascade-mask-rcnn_mavit-s_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_L.pth')),
    neck=dict(in_channels=[96, 192, 448, 640]))

# the source trains 1 image per GPU on 8 GPUs; lr is for that total batch of 8
optim_wrapper = dict(optimizer=dict(lr=0.0002))
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
