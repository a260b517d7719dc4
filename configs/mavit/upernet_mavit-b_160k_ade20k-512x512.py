# upernet_mavit-b_160k_ade20k-512x512: MAViT-B (base), over the T config.
# Recipe: qhfan/MALA segmentation/configs/MALA/Uper_b_2x.py.
# Deviations from it: none.
_base_ = './upernet_mavit-t_160k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/MAViT_B.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))
