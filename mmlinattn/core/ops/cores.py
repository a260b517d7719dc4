"""The table of attention cores (:data:`CORES`), read by the attention modules, the ``attn_type``
parser (:func:`parse_attn_type`) and the analysis tools. A *core* is the attention proper on
(B, h, N, d) tensors; a new one is one :func:`register_core` call plus its two functions::

    register_core(Core('cosine', 'C', cosine_attention, cosine_attention_matrix,
                       kernels=('identity',)))
    MAViT(arch='tiny', attn_type='CCSS')     # builds, with the new core in stages 1-2

A :class:`Core`: ``name``, ``letter`` (in ``attn_type``), ``linear`` and ``matrix`` (its functions);
``kernels`` it accepts (the first its default); ``rope``: ``'none'``, ``'inside'`` (the function
takes ``rope=(sin, cos)``: MALA rotates only its numerator) or ``'qk'`` (q, k rotated before);
``scaled`` (takes ``scale``); ``bias`` (takes an additive ``attn_bias``); ``windowed``
(InLine-Swin runs it in Swin's windows; needs ``bias``); ``reduced_kv`` (PVT's ``sr_ratio``);
``options`` (further keywords: MALA's ``beta``/``gamma``); ``local_residual`` (InLine's, on by
default); ``title``, ``description`` (its names in messages and tools).
"""
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .attention import (
    inline_attention,
    inline_attention_matrix,
    linear_attention,
    linear_attention_matrix,
    mala_attention,
    mala_attention_matrix,
    softmax_attention,
    softmax_attention_matrix,
)
from .kernels import apply_rope, get_kernel

Tensor = torch.Tensor

ROPE_MODES = ('none', 'inside', 'qk')


@dataclass(frozen=True)
class Core:
    """One attention core (see the module docstring for the fields)."""
    name: str
    letter: str
    linear: Callable[..., Tensor]
    matrix: Callable[..., Tensor]
    kernels: Tuple[str, ...] = ()
    rope: str = 'none'
    scaled: bool = True
    bias: bool = False
    windowed: bool = False
    reduced_kv: bool = False
    options: Tuple[str, ...] = ()
    local_residual: bool = False
    title: str = ''
    description: str = ''

    def __post_init__(self):
        if not re.fullmatch(r'[A-Z]', self.letter):
            raise ValueError(f'core {self.name!r}: the letter must be one capital A-Z, got '
                             f'{self.letter!r}')
        if self.rope not in ROPE_MODES:
            raise ValueError(f'core {self.name!r}: rope must be one of {ROPE_MODES}, got '
                             f'{self.rope!r}')
        for k in self.kernels:
            get_kernel(k)
        if self.windowed and not self.bias:
            raise ValueError(f'core {self.name!r}: windowed blocks add a relative position bias, '
                             'so a windowed core must take one (bias=True)')

    def bind(self, scale: Optional[float] = None, kernel: Optional[str] = None,
             **options) -> dict:
        """The call-invariant keywords the core takes (scale, kernel, own options)."""
        kw = {}
        if self.scaled:
            kw['scale'] = scale
        if self.kernels:
            if kernel is not None and kernel not in self.kernels:
                raise ValueError(f'the {self.name} core takes the kernels {list(self.kernels)}, '
                                 f'not {kernel!r}')
            kw['kernel'] = kernel or self.kernels[0]
        kw.update({k: v for k, v in options.items() if k in self.options})
        return kw

    def _per_call(self, rope, attn_bias: Optional[Tensor]) -> dict:
        kw = {}
        if self.rope == 'inside':
            kw['rope'] = rope
        if self.bias:
            kw['attn_bias'] = attn_bias
        elif attn_bias is not None:
            raise ValueError(f'the {self.name} core takes no attention bias (window blocks need '
                             f'one)')
        return kw

    def kwargs(self, scale: Optional[float] = None, kernel: Optional[str] = None, rope=None,
               attn_bias: Optional[Tensor] = None, **options) -> dict:
        """:meth:`bind`'s keywords and the per-call ``rope`` / ``attn_bias`` the core takes."""
        return dict(self.bind(scale, kernel, **options), **self._per_call(rope, attn_bias))

    def _rotated(self, q: Tensor, k: Tensor, rope) -> Tuple[Tensor, Tensor]:
        # in q's and k's own dtype: SDPA refuses float32 q, k beside a half v (torch 2.1's CPU)
        if self.rope == 'qk' and rope is not None:
            return apply_rope(q, *rope).to(q.dtype), apply_rope(k, *rope).to(k.dtype)
        return q, k

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, rope=None, attn_bias=None,
                 dropout_p: float = 0., **settings) -> Tensor:
        """Run the linear-time function on (B, h, N, d) tensors (through :meth:`run`)."""
        return self.run(q, k, v, self.bind(**settings), rope=rope, attn_bias=attn_bias,
                        dropout_p=dropout_p)

    def run(self, q: Tensor, k: Tensor, v: Tensor, bound: dict, rope=None,
            attn_bias: Optional[Tensor] = None, dropout_p: float = 0.) -> Tensor:
        """:meth:`__call__` with :meth:`bind`'s settings (``dropout_p``: 0 outside training)."""
        kw = dict(bound, **self._per_call(rope, attn_bias))
        if 'dropout_p' in self.options:
            kw['dropout_p'] = dropout_p
        q, k = self._rotated(q, k, rope)
        return self.linear(q, k, v, **kw)

    def attention_matrix(self, q: Tensor, k: Tensor, rope=None, **settings) -> Tensor:
        """The explicit (B, h, N, N) matrix from the same settings (quadratic; analysis, tests)."""
        kw = self.kwargs(rope=rope, **settings)
        kw.pop('dropout_p', None)
        q, k = self._rotated(q, k, rope)
        return self.matrix(q, k, **kw)


CORES: Dict[str, Core] = {}


def register_core(core: Core, replace: bool = False) -> Core:
    """Add ``core`` to :data:`CORES`; its name and letter must be new unless ``replace``."""
    if not replace:
        if core.name in CORES:
            raise ValueError(f'an attention core named {core.name!r} exists already')
        taken = core_letters()
        if core.letter in taken:
            raise ValueError(f'letter {core.letter!r} is taken by the {taken[core.letter]} core')
    CORES[core.name] = core
    return core


def unregister_core(name: str) -> None:
    CORES.pop(name, None)


def get_core(name: str) -> Core:
    """The core called ``name``; the error lists the registered ones."""
    try:
        return CORES[name]
    except KeyError:
        raise ValueError(f'unknown attention core {name!r}; choose one of {list(CORES)}') from None


def core_letters() -> Dict[str, str]:
    """``attn_type`` letter -> core name, for every registered core."""
    return {c.letter: c.name for c in CORES.values()}


register_core(Core(
    'inline', 'I', inline_attention, inline_attention_matrix,
    kernels=('identity', 'relu', 'leakyrelu', 'exp', 'elu'), local_residual=True, title='InLine',
    description='InLine: injective linear attention (+ local residual in token modules)'))
register_core(Core(
    'softmax', 'S', softmax_attention, softmax_attention_matrix, rope='qk', bias=True,
    windowed=True, reduced_kv=True, options=('dropout_p',), title='softmax',
    description='softmax attention (SDPA)'))
register_core(Core(
    'linear', 'L', linear_attention, linear_attention_matrix,
    kernels=('relu', 'elu', 'identity', 'leakyrelu', 'exp'), scaled=False, title='linear',
    description='plain linear attention, phi(q) phi(K)^T V / phi(q) sum phi(k)'))
register_core(Core(
    'mala', 'M', mala_attention, mala_attention_matrix, rope='inside', options=('beta', 'gamma'),
    title='MALA', description='MALA: magnitude-aware linear attention (ELU+1 features)'))


# attn_type: which core each block of a backbone runs
_LEGACY_MIXED = re.compile(r'^([A-Z]+)(\d+)$')
_STAGE_TOKEN = re.compile(r'\(([^()]*)\)|([A-Z])|(.)')
_RUN = re.compile(r'([A-Z])(\d*)')


def _letters_help(letters: Dict[str, str]) -> str:
    return ', '.join(f'{k} ({CORES[v].title or v})' for k, v in letters.items())


def _mixed_stage(body: str, depth: int, letters: Dict[str, str], where: str) -> List[str]:
    """``I2S`` -> 2 blocks of I, then S for the rest of the stage (``depth`` blocks)."""
    runs = _RUN.findall(body)
    if not runs or ''.join(a + n for a, n in runs) != body:
        raise ValueError(f'{where}: cannot read the mixed stage ({body}); write runs of a letter '
                         'and a block count, the last count may be left out: '
                         'e.g. (I2S) = 2 blocks of I, then S')
    blocks: List[str] = []
    for j, (letter, count) in enumerate(runs):
        if letter not in letters:
            raise ValueError(f'{where}: unknown attention letter {letter!r} in ({body}); valid: '
                             f'{_letters_help(letters)}')
        if not count and j != len(runs) - 1:
            raise ValueError(f'{where}: only the last run of ({body}) may leave out its block '
                             'count')
        n = int(count) if count else depth - len(blocks)
        blocks += [letters[letter]] * n
    if len(blocks) != depth:
        raise ValueError(f'{where}: the mixed stage ({body}) has {len(blocks)} blocks but the '
                         f'stage has {depth}')
    return blocks


def _legacy_swin(attn_type: str, n: int) -> Optional[str]:
    """InLine-Swin's old ``'IIMS2'`` (``M``: k InLine blocks, then softmax) in today's syntax."""
    m = _LEGACY_MIXED.match(attn_type)
    if not m or len(m.group(1)) != n or 'M' not in m.group(1):
        return None
    k = m.group(2)
    return ''.join(f'(I{k}S)' if c == 'M' else c for c in m.group(1))


def parse_attn_type(attn_type, depths: Sequence[int], owner: str = 'backbone',
                    legacy_mixed: bool = False) -> List[List[str]]:
    """One core name per block from ``attn_type``: per stage a core's letter or a mixed stage in
    parentheses (runs of a letter and a block count, the last count optional: ``'II(I2S)S'``), or a
    list per stage of letters, core names or lists of names. ``legacy_mixed``: InLine-Swin's old
    ``'IIMS2'`` (``M`` then meant "mixed") with a ``FutureWarning``."""
    n = len(depths)
    letters = core_letters()
    names = set(letters.values())
    if isinstance(attn_type, str):
        if legacy_mixed:
            new = _legacy_swin(attn_type, n)
            if new is not None:
                warnings.warn(f'{owner}: attn_type={attn_type!r} is the old spelling of a mixed '
                              f'stage (M followed by a block count); write {new!r} (M now means '
                              'MALA)', FutureWarning, stacklevel=3)
                attn_type = new
        specs: list = []
        for group, letter, other in _STAGE_TOKEN.findall(attn_type):
            if other:
                raise ValueError(f'{owner}: cannot read {other!r} in attn_type {attn_type!r}: one '
                                 f'letter per stage from {_letters_help(letters)}, or a mixed '
                                 'stage in parentheses such as (I2S)')
            specs.append(('mixed', group) if letter == '' else letter)
    elif isinstance(attn_type, (list, tuple)):
        specs = list(attn_type)
    else:
        raise TypeError(f'{owner}: attn_type must be a str or a list, got '
                        f'{type(attn_type).__name__}')
    if len(specs) != n:
        raise ValueError(f'{owner}: attn_type {attn_type!r} needs one entry per stage ({n} '
                         'stages); letters: ' + ', '.join(f'{k}={v}' for k, v in letters.items()) +
                         '; a mixed stage in parentheses, e.g. (I2S)')
    out = []
    for i, spec in enumerate(specs):
        where = f'{owner}: stage {i} of attn_type {attn_type!r}'
        if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == 'mixed':
            blocks = _mixed_stage(spec[1], depths[i], letters, where)
        elif isinstance(spec, (list, tuple)):
            blocks = list(spec)
        elif spec in letters:
            blocks = [letters[spec]] * depths[i]
        elif spec in names:
            blocks = [spec] * depths[i]
        else:
            raise ValueError(f'{owner}: unknown attention {spec!r} for stage {i} in {attn_type!r}; '
                             f'valid: {_letters_help(letters)}')
        if len(blocks) != depths[i] or any(b not in names for b in blocks):
            raise ValueError(f'{where}: needs {depths[i]} attention names from {sorted(names)}, '
                             f'got {blocks}')
        out.append(blocks)
    return out


def format_attn_type(cores: Sequence[Sequence[str]]) -> str:
    """The shortest string :func:`parse_attn_type` reads back into ``cores``."""
    by_name = {c.name: c.letter for c in CORES.values()}
    out = []
    for blocks in cores:
        letters = [by_name[b] for b in blocks]
        if len(set(letters)) == 1:
            out.append(letters[0])
            continue
        runs = []
        for letter in letters:
            if runs and runs[-1][0] == letter:
                runs[-1][1] += 1
            else:
                runs.append([letter, 1])
        out.append('(' + ''.join(f'{a}{c}' for a, c in runs[:-1]) + runs[-1][0] + ')')
    return ''.join(out)
