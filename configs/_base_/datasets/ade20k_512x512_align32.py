# ADE20K as ade20k_512x512.py, tested as PVT's Semantic FPN configs do (their AlignResize with
# keep_ratio=True, size_divisor=32): resize keeping the aspect ratio to fit 2048x512, then resize
# (stretch, no padding) each side up to the next multiple of 32, which mmseg's ResizeToMultiple
# does. The prediction is resized back to the original image for evaluation.
_base_ = './ade20k_512x512.py'
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
