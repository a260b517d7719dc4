# upernet_inline-swin-b_160k_ade20k-512x512: InLineSwin-B (base), over the T config.
# Recipe: SwinTransformer/Swin-Transformer-Semantic-Segmentation
#   configs/swin/upernet_swin_base_patch4_window7_512x512_160k_ade20k.py.
# Deviations from it: none.
_base_ = './upernet_inline-swin-t_160k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='base',
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_b.pth')),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
