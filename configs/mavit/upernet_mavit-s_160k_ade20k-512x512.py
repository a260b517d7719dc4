# upernet_mavit-s_160k_ade20k-512x512: MAViT-S (small), over the T config.
# Recipe: qhfan/MALA segmentation/configs/MALA/Uper_s_2x.py.
# Deviations from it: none.
_base_ = './upernet_mavit-t_160k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_S.pth')),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
