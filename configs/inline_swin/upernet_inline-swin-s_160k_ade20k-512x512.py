# upernet_inline-swin-s_160k_ade20k-512x512: InLineSwin-S (small), over the T config.
# Recipe: SwinTransformer/Swin-Transformer-Semantic-Segmentation
#   configs/swin/upernet_swin_small_patch4_window7_512x512_160k_ade20k.py.
# Deviations from it: none.
_base_ = './upernet_inline-swin-t_160k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_swin_s.pth')))
