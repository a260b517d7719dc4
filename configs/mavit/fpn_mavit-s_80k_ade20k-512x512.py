# fpn_mavit-s_80k_ade20k-512x512: MAViT-S (small), over the T config.
# Recipe: qhfan/MALA segmentation/configs/MALA/FPN_s_1x.py.
# Deviations from it: none.
_base_ = './fpn_mavit-t_80k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_S.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))
