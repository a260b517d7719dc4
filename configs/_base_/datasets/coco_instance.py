# COCO 2017 instances under data/coco/ (annotations/instances_{train,val}2017.json, train2017/,
# val2017/); single scale 1333x800, 2 images per GPU.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'
