"""How each family's released files are laid out (:class:`AuthorsLayout`): classification parts,
recomputed buffers, size-dependent tensors, and the classifier's key mapping."""
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class AuthorsLayout:
    """How a family's released ImageNet checkpoint maps onto our backbone and our mmpretrain
    ImageClassifier.

    Args:
        family (str): ``inline_pvt``, ``inline_swin`` or ``mavit`` (the converter's names).
        classification (tuple[str]): key prefixes of the classification parts (head, ...).
        recomputed (tuple[str]): last key names of the authors' buffers our model recomputes.
        optional (tuple[str]): last key names of our buffers that a file may lack.
        classifier (tuple[tuple[str, str]]): authors' prefix -> ImageClassifier prefix (others go
            under ``backbone.``).
        conv_head (bool): the authors' head is a 1x1 conv; mmpretrain's is a Linear.
        adapt (callable | None): pure ``adapt(state, model) -> new state`` (size-dependent tensors).
    """
    family: str
    classification: Tuple[str, ...]
    recomputed: Tuple[str, ...] = ()
    optional: Tuple[str, ...] = ()
    classifier: Tuple[Tuple[str, str], ...] = (('head.', 'head.fc.'),)
    conv_head: bool = False
    adapt: Optional[Callable] = None

    def filter(self, state: Dict[str, Tensor], model: Optional[torch.nn.Module] = None
               ) -> Tuple[Dict[str, Tensor], Dict[str, List[str]]]:
        """A state dict -> ``(tensors to load, dict(dropped=[...], ignored=[...]))``; pure."""
        out, dropped, ignored = OrderedDict(), [], []
        own = model.state_dict() if model is not None else {}
        for k, v in state.items():
            if k.startswith(self.classification):
                dropped.append(k)
            elif k.rsplit('.', 1)[-1] in self.recomputed and k not in own:
                ignored.append(k)
            else:
                out[k] = v
        if self.adapt is not None and model is not None:
            out = self.adapt(out, model)
        return out, dict(dropped=dropped, ignored=ignored)

    @property
    def tolerated(self) -> Tuple[str, ...]:
        """Buffer names that may be missing on either side of a load."""
        return self.recomputed + self.optional

    def to_classifier(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The authors' whole classifier -> our mmpretrain ImageClassifier's keys."""
        out = OrderedDict()
        for k, v in state.items():
            if k.rsplit('.', 1)[-1] in self.recomputed:
                continue
            src, dst = next(((p, d) for p, d in self.classifier if k.startswith(p)), (None, None))
            if src is None:
                out['backbone.' + k] = v
                continue
            if src == 'head.' and self.conv_head and v.dim() == 4:
                v = v.flatten(1)
            out[dst + k[len(src):]] = v
        return out

    def from_classifier(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The inverse of :meth:`to_classifier`: our ImageClassifier -> the authors' layout."""
        out = OrderedDict()
        for k, v in state.items():
            src, dst = next(((p, d) for p, d in self.classifier if k.startswith(d)), (None, None))
            if dst is not None:
                if src == 'head.' and self.conv_head and v.dim() == 2:
                    v = v[:, :, None, None]
                out[src + k[len(dst):]] = v
            elif k.startswith('backbone.'):
                out[k[len('backbone.'):]] = v
            else:
                raise KeyError(f'{k}: not a key of a {self.family} ImageClassifier built from '
                               'configs/classification')
        return out
