from .backbones import InLinePVT, InLineSwin, MAViT  # noqa: F401  (registers them)

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT']
