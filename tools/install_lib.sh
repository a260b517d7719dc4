#!/usr/bin/env bash
# Shared steps of tools/install.sh and tools/install_compat.sh; sourced, never run on its own.
#
# The caller sets ROOT, VENV, STAMP, TAG (the log prefix) and STAMP_SCRIPT (its own path, hashed into
# the stamp with this file, setup.py and requirements/*.txt) before sourcing; PYTHON may be preset.
# Afterwards the caller has: log / die, PYTHON (a 3.11 interpreter), stamp_up_to_date, make_venv
# (sets VPY), mmcv_wheel_dir (the cache folder of mmcv wheels built against the venv's torch) and
# mmcv_ok (mmcv imports at MMCV_VERSION and its compiled NMS runs).

MMCV_VERSION=2.1.0
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/mmlinattn

log() { printf '[%s] %s\n' "$TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$TAG" "$*" >&2; exit 1; }

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && \
       "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null
    then
      PYTHON=$cand; break
    fi
  done
fi
[[ -n "$PYTHON" ]] || die "Python 3.11 is required (torch 2.14.1 / torchvision 0.29.1 wheels are \
cp311); set PYTHON=/path/to/python3.11"

# Everything that decides what gets installed goes into the stamp.
want_stamp=$(cat "$STAMP_SCRIPT" "${BASH_SOURCE[0]}" "$ROOT/setup.py" "$ROOT"/requirements/*.txt \
  | sha256sum | cut -d' ' -f1)

# 0 when the venv was installed from exactly these files and still imports mmcv's ops and us.
stamp_up_to_date() {
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] && \
    "$VENV/bin/python" -c 'import mmcv._ext, mmlinattn' >/dev/null 2>&1
}

make_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtual environment $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
  fi
  VPY=$VENV/bin/python
}

# The cache folder, keyed on torch version, python tag and machine, so that a wheel built against
# another torch is never reused.
mmcv_wheel_dir() {
  local torch_version pytag
  torch_version=$("$VPY" -c 'import torch; print(torch.__version__)')
  pytag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  echo "$CACHE_ROOT/wheels/mmcv-$MMCV_VERSION-torch$torch_version-$pytag-$(uname -m)"
}

mmcv_ok() {
  "$VPY" - <<PYEOF >/dev/null 2>&1
import mmcv, mmcv._ext, torch
from mmcv.ops import nms
assert mmcv.__version__ == '$MMCV_VERSION', mmcv.__version__
b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]]); s = torch.tensor([0.9, 0.8])
nms(b, s, 0.5)
PYEOF
}
