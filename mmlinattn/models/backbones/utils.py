from typing import Dict, List, Sequence


def parse_stage_attn(attn_type, depths: Sequence[int], letters: Dict[str, str],
                     owner: str) -> List[List[str]]:
    """Expand a per-stage attention spec into one core name per block.

    ``attn_type`` is a string with one letter per stage (``letters`` maps letters to core names), or a
    list with one entry per stage, each a letter, a core name, or a list of names (one per block).
    """
    n = len(depths)
    if isinstance(attn_type, str):
        specs = list(attn_type)
    elif isinstance(attn_type, (list, tuple)):
        specs = list(attn_type)
    else:
        raise TypeError(f'{owner}: attn_type must be a str or a list, got {type(attn_type).__name__}')
    if len(specs) != n:
        raise ValueError(f'{owner}: attn_type {attn_type!r} needs one entry per stage ({n} stages); '
                         f'letters: ' + ', '.join(f'{k}={v}' for k, v in letters.items()))
    names = set(letters.values())
    out = []
    for i, spec in enumerate(specs):
        if isinstance(spec, (list, tuple)):
            blocks = list(spec)
        elif spec in letters:
            blocks = [letters[spec]] * depths[i]
        elif spec in names:
            blocks = [spec] * depths[i]
        else:
            raise ValueError(f'{owner}: unknown attention {spec!r} for stage {i} in {attn_type!r}; '
                             'valid: ' + ', '.join(f'{k} ({v})' for k, v in letters.items()))
        if len(blocks) != depths[i] or any(b not in names for b in blocks):
            raise ValueError(f'{owner}: stage {i} needs {depths[i]} attention names from '
                             f'{sorted(names)}, got {blocks}')
        out.append(blocks)
    return out
