# Semantic FPN (Kirillov et al.) for ADE20K's 150 classes, 512x512 crops.
_base_ = 'mmseg::_base_/models/fpn_r50.py'
# LinAttnEncoderDecoder: mmseg's EncoderDecoder (same modules and forward) whose test-time
# post-processing takes a large image's label map in bands instead of full-size logits, under any
# Runner and tool (mmlinattn.apis.large_image)
model = dict(
    type='LinAttnEncoderDecoder',
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(_delete_=True, type='MAViT', arch='tiny'),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))
