# fpn_inline-pvt-s_80k_ade20k-512x512: InLinePVT-S (small), over the T config.
# Recipe: whai362/PVT segmentation/configs/sem_fpn/PVT/fpn_pvt_s_ade20k_40k.py.
# Deviations from it: 16 images (8 GPUs x 2) for 80k iterations at lr 1e-4 where the source trains
#   32 (8 x 4) for 40k at 2e-4: the same images seen, the lr scaled linearly, as MAViT's 80k
#   Semantic FPN.
_base_ = './fpn_inline-pvt-t_80k_ade20k-512x512.py'

model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_s.pth')))
