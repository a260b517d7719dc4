from .inline_pvt import InLinePVT
from .inline_swin import InLineSwin
from .mavit import MAViT

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT']
