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
    ImageClassifier. Parameter names are the authors' wherever a checkpoint needs them, so the
    backbone mapping is: drop the classification parts, drop the buffers we recompute, and let
    ``adapt`` resize what depends on the input size.

    Args:
        family (str): ``inline_pvt``, ``inline_swin`` or ``mavit`` (the converter's names).
        classification (tuple[str]): key prefixes of the classification parts (head, final norm,
            ...).
        recomputed (tuple[str]): last key names of the authors' buffers that our model recomputes
            instead of storing (dropped from their files).
        optional (tuple[str]): last key names of our buffers that a file may lack (recomputable).
        classifier (tuple[tuple[str, str]]): authors' prefix -> ImageClassifier prefix for the
            classification parts (every other key goes under ``backbone.``).
        conv_head (bool): the authors' head is a 1x1 conv (4-D weight); mmpretrain's is a Linear.
        adapt (callable | None): ``adapt(state, model) -> state`` for tensors that depend on the
            model's settings (e.g. position tables learned at 224 px); pure, returns a new dict.
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
        """The authors' (or our own backbone's) state dict -> the backbone's: returns the tensors to
        load and ``dict(dropped=[classification keys], ignored=[recomputed buffers])``. Pure: the
        input dict is not changed. ``model`` (for ``adapt``) is only read."""
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
            src = next((p for p, _ in self.classifier if k.startswith(p)), None)
            if src is None:
                out['backbone.' + k] = v
                continue
            dst = dict(self.classifier)[src]
            if src == 'head.' and self.conv_head and v.dim() == 4:
                v = v.flatten(1)
            out[dst + k[len(src):]] = v
        return out

    def from_classifier(self, state: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The inverse of :meth:`to_classifier`: our ImageClassifier -> the authors' layout."""
        out = OrderedDict()
        for k, v in state.items():
            dst = next((d for _, d in self.classifier if k.startswith(d)), None)
            if dst is not None:
                src = next(p for p, d in self.classifier if d == dst)
                if src == 'head.' and self.conv_head and v.dim() == 2:
                    v = v[:, :, None, None]
                out[src + k[len(dst):]] = v
            elif k.startswith('backbone.'):
                out[k[len('backbone.'):]] = v
            else:
                raise KeyError(f'{k}: not a key of a {self.family} ImageClassifier built from '
                               'configs/classification')
        return out
