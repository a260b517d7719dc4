"""The environment variables mmlinattn reads, parsed and checked here (:data:`SETTINGS`, with values
and defaults): ``MMLINATTN_UPSTREAM_FIXES``, ``MMLINATTN_FULL_LOGITS_BUDGET`` (logits a segmentation
test keeps), ``MMLINATTN_LOCK_STALE_S`` (when another host's lock expired),
``MMLINATTN_CHECKPOINT_BASE_URL`` and ``HF_ENDPOINT`` (checkpoint mirrors). :func:`get` reads one
(:class:`SettingError`: ``NAME=VALUE: expected ...``); the tools call :func:`check_all` first."""
import os
import re
from typing import Callable, Dict, NamedTuple, Optional


class SettingError(ValueError):
    """An environment variable of mmlinattn with a value it cannot take."""


class Setting(NamedTuple):
    name: str
    default: Optional[str]  # None: unset means None
    parse: Callable[[str], object]  # raises ValueError on a bad value
    expected: str  # what the message says the value should be


def _switch(value: str) -> bool:
    v = value.strip().lower()
    if v in ('1', 'on', 'true', 'yes'):
        return True
    if v in ('0', 'off', 'false', 'no'):
        return False
    raise ValueError(value)


_UNITS = {'': 1, 'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}


def _bytes(value: str) -> int:
    found = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*', value.lower())
    if not found:
        raise ValueError(value)
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def _seconds(value: str) -> float:
    found = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*', value.lower())
    if not found:
        raise ValueError(value)
    return float(found.group(1)) * {None: 1, 's': 1, 'm': 60, 'min': 60, 'h': 3600}[found.group(2)]


def _stale_seconds(value: str) -> float:
    seconds = _seconds(value)
    if seconds < 90:  # 3 heartbeats (30 s each): a live run on another host must never look stale
        raise ValueError(value)
    return seconds


def _url(value: str) -> str:
    v = value.strip()
    if not v.startswith(('http://', 'https://')):
        raise ValueError(value)
    return v.rstrip('/')


SETTINGS: Dict[str, Setting] = {s.name: s for s in (
    Setting('MMLINATTN_UPSTREAM_FIXES', '1', _switch,
            '1, on, true or yes (the fixes on), or 0, off, false or no'),
    Setting('MMLINATTN_FULL_LOGITS_BUDGET', '1G', _bytes,
            'bytes: a number with an optional unit K, M, G or T (powers of 1024), e.g. 2G'),
    Setting('MMLINATTN_LOCK_STALE_S', '600', _stale_seconds,
            'seconds, at least 90 (three 30 s refreshes of a live lock): a number with an optional '
            'unit s, m or h, e.g. 600 or 10m'),
    Setting('MMLINATTN_CHECKPOINT_BASE_URL', None, _url,
            'an http:// or https:// URL (the mirror that serves the checkpoints)'),
    Setting('HF_ENDPOINT', None, _url,
            'an http:// or https:// URL (the Hugging Face Hub or its mirror, e.g. '
            'https://hf-mirror.example.org)'),
)}


def get(name: str):
    """The parsed value of the variable ``name`` (its default when unset or empty)."""
    setting = SETTINGS[name]
    raw = os.environ.get(name, '')
    if not raw.strip():
        return None if setting.default is None else setting.parse(setting.default)
    try:
        return setting.parse(raw)
    except ValueError:
        raise SettingError(f'{name}={raw}: expected {setting.expected}') from None


def check_all() -> None:
    """Read every variable; the first bad value raises :class:`SettingError`."""
    for name in SETTINGS:
        get(name)
