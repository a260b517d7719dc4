"""The backbone classes, one per family (registered in mmengine's root ``MODELS``). What the
package and its tools know about each family beyond its class is one row of
:data:`mmlinattn.core.families.FAMILIES`."""
from .inline_pvt import InLinePVT
from .inline_swin import InLineSwin
from .mavit import MAViT

__all__ = ['InLinePVT', 'InLineSwin', 'MAViT']
