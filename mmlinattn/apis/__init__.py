"""What a user calls around a trained model, as ``mmdet.apis``: an inferencer built from a config
and checkpoint and pictures of its predictions (:mod:`.inference`), segmentation of large images
without full-size float logits (:mod:`.large_image`). Importing this package imports no
submodule."""
