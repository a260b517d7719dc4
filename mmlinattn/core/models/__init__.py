from ..families import out_channels  # noqa: F401
from .backbones import InLinePVT, InLineSwin, MAViT  # noqa: F401  (registers them)
from .classification import MAViTClsNeck, authors_to_classifier, classifier_to_authors  # noqa: F401

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT', 'out_channels', 'MAViTClsNeck',
           'authors_to_classifier', 'classifier_to_authors']
