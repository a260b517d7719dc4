# UperNet with an auxiliary FCN head on stage 3 (loss weight 0.4) for ADE20K, 512x512 crops.
_base_ = 'mmseg::_base_/models/upernet_swin.py'
# LinAttnEncoderDecoder: mmseg's EncoderDecoder (same modules and forward) whose test-time
# post-processing takes a large image's label map in bands instead of full-size logits, under any
# Runner and tool (mmlinattn.apis.large_image)
model = dict(
    type='LinAttnEncoderDecoder',
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),
    backbone=dict(_delete_=True, type='MAViT', arch='tiny'),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, in_index=2, num_classes=150))
