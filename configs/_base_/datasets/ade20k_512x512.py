# ADE20K (SceneParsing) under data/ade/ADEChallengeData2016 (images/{training,validation},
# annotations/{training,validation}; label 0 = "other", ignored via reduce_zero_label).
# 512x512 crops, 2 images per GPU (16 on 8 GPUs); test at short side 512 (2048x512), whole image.
_base_ = 'mmseg::_base_/datasets/ade20k.py'
train_dataloader = dict(batch_size=2, num_workers=2)
val_dataloader = dict(batch_size=1, num_workers=2)
test_dataloader = val_dataloader
