"""What a user calls around a trained model: :mod:`.inference` (inferencer, pictures) and
:mod:`.large_image` (segmentation of large images). Imports no submodule."""
