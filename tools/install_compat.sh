#!/usr/bin/env bash
# Builds a second environment with the OLDEST supported OpenMMLab stack and installs mmlinattn into it
# the way a user installs it into the environment they already train in (`make test-compat`).
#
#   bash tools/install_compat.sh     # creates ./.venv-compat (or $MMLINATTN_COMPAT_VENV)
#
# The stack: requirements/oldest.txt (mmengine 0.10.4, mmdet 3.2.0, mmsegmentation 1.2.1,
# mmpretrain 1.1.1, numpy 1.26.4) beside the same torch 2.14.1 / torchvision 0.29.1 and the same
# mmcv 2.1.0 wheel as the main environment. That wheel is the one tools/install.sh built and cached
# under ${XDG_CACHE_HOME:-~/.cache}/mmlinattn/wheels/; it is reused, never rebuilt here (run
# `make install` first).
#
# Then a plain `pip install -e .` (with its dependencies, as a user would run it): it must leave every
# installed distribution as it was - `pip freeze` before and after are compared, and any difference
# fails the script. That is what setup.py's version ranges (requirements/runtime.txt) promise.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMLINATTN_COMPAT_VENV:-$ROOT/.venv-compat}
PYTHON=${PYTHON:-}
MMCV_VERSION=2.1.0
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/mmlinattn
OLDEST=$ROOT/requirements/oldest.txt

log() { printf '[install-compat] %s\n' "$*" >&2; }
die() { printf '[install-compat] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ -z "$PYTHON" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && \
       "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      PYTHON=$cand; break
    fi
  done
fi
[[ -n "$PYTHON" ]] || die "Python 3.11 is required (torch 2.14.1 wheels are cp311); set PYTHON=/path/to/python3.11"

stamp_inputs=("$ROOT/tools/install_compat.sh" "$ROOT/setup.py" "$ROOT"/requirements/*.txt)
want_stamp=$(cat "${stamp_inputs[@]}" | sha256sum | cut -d' ' -f1)
STAMP=$VENV/.mmlinattn-compat-stamp

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] && \
   "$VENV/bin/python" -c 'import mmcv._ext, mmlinattn' >/dev/null 2>&1; then
  log "up to date: $VENV"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
VPY=$VENV/bin/python
pipo() { "$VPY" -m pip install --disable-pip-version-check -c "$OLDEST" "$@"; }

log "build tools, torch + torchvision (the same pair as the main environment)"
pipo -q -r "$ROOT/requirements/build.txt"
pipo -q -r "$ROOT/requirements/torch.txt"

TORCH_VERSION=$("$VPY" -c 'import torch; print(torch.__version__)')
PYTAG=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_DIR=$CACHE_ROOT/wheels/mmcv-$MMCV_VERSION-torch$TORCH_VERSION-$PYTAG-$(uname -m)
wheel=$(ls "$WHEEL_DIR"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)
[[ -n "$wheel" ]] || die "no cached mmcv $MMCV_VERSION wheel for torch $TORCH_VERSION in $WHEEL_DIR: run \
'make install' (tools/install.sh builds and caches it) first"
log "mmcv from the cached wheel $wheel"
pipo -q --no-deps "$wheel"

log "the oldest supported OpenMMLab stack (requirements/oldest.txt) and the test tools"
pipo -q "addict" "yapf" "packaging" "pyyaml" "Pillow" -r "$ROOT/requirements/runtime.txt" \
  -r "$ROOT/requirements/tests.txt"

"$VPY" - "$OLDEST" <<'EOF' || die "the environment is not the oldest stack of requirements/oldest.txt"
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
bad = []
for line in open(sys.argv[1]):
    line = line.split('#', 1)[0].strip()
    if not line:
        continue
    req = Requirement(line)
    have = version(req.name)
    if not req.specifier.contains(have, prereleases=True):
        bad.append(f'{req.name} {have} (wants {req.specifier})')
sys.exit('; '.join(bad) if bad else 0)
EOF

log "mmlinattn: a plain 'pip install -e .', as a user would run it; it must change nothing else"
before=$(mktemp); after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
"$VPY" -m pip uninstall -q -y mmlinattn >/dev/null 2>&1 || true
"$VPY" -m pip freeze --exclude-editable | sort > "$before"
"$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation -e "$ROOT"
"$VPY" -m pip freeze --exclude-editable | sort > "$after"
if ! diff -u "$before" "$after" >&2; then
  die "'pip install -e .' changed the installed stack (diff above): setup.py's ranges do not admit it"
fi
log "pip freeze unchanged by 'pip install -e .' ($(wc -l < "$after") distributions)"

"$VPY" - <<'EOF' || die "mmcv's ops or an OpenMMLab package do not load"
import mmcv, mmcv._ext, torch
from mmcv.ops import nms
nms(torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]]), torch.tensor([0.9, 0.8]), 0.5)
import mmdet, mmengine, mmpretrain, mmseg, numpy, torchvision, mmlinattn
print('[install-compat] stack: ' + ', '.join(f'{m.__name__} {m.__version__}' for m in (
    torch, torchvision, mmcv, mmengine, mmdet, mmseg, mmpretrain, numpy)), file=__import__('sys').stderr)
EOF
"$VPY" -m pip check >&2 || log "pip check reported the conflicts above"

echo "$want_stamp" > "$STAMP"
log "done: $VENV"
