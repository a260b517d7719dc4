"""The backbone classes, one per family (rows of :data:`mmlinattn.core.families.FAMILIES`)."""
from .inline_pvt import InLinePVT
from .inline_swin import InLineSwin
from .mavit import MAViT

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT']
