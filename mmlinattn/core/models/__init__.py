from .backbones import InLinePVT, InLineSwin, MAViT, out_channels  # noqa: F401  (registers them)
from .classification import MAViTClsNeck, authors_to_classifier, classifier_to_authors  # noqa: F401

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT', 'out_channels', 'MAViTClsNeck',
           'authors_to_classifier',
           'classifier_to_authors']
