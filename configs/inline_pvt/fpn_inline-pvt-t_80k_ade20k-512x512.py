# fpn_inline-pvt-t_80k_ade20k-512x512: InLinePVT-T (tiny); the S, M and L configs inherit it.
# Recipe: whai362/PVT segmentation/configs/sem_fpn/PVT/fpn_pvt_t_ade20k_40k.py.
# Deviations from it: 16 images (8 GPUs x 2) for 80k iterations at lr 1e-4 where the source trains
#   32 (8 x 4) for 40k at 2e-4: the same images seen, the lr scaled linearly, as MAViT's 80k
#   Semantic FPN.
# _align32: PVT tests at the keep-ratio scale rounded up to multiples of 32 (its AlignResize)
_base_ = ['../_base_/models/fpn_ade20k.py', '../_base_/datasets/ade20k_512x512_align32.py',
          '../_base_/schedules/schedule_80k.py', '../_base_/default_runtime_seg.py']

model = dict(
    backbone=dict(  # replaces the base model's backbone (_delete_), not merged into it
        _delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.1, out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_pvt_t.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

# every parameter decays, as in the source (no paramwise rules)
optim_wrapper = dict(optimizer=dict(lr=0.0001, weight_decay=0.0001))
# poly decay to 0.0, as the source (the schedule base decays to 1e-6)
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000, by_epoch=False),
]
# precision: the source trained in fp32, as this config does (--amp: mixed precision on a GPU)
amp_loss_scale = None
