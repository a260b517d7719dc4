# COCO 2017 boxes under data/coco/, single scale 1333x800, 2 images per GPU.
_base_ = 'mmdet::_base_/datasets/coco_detection.py'
