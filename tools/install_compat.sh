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
STAMP=$VENV/.mmlinattn-compat-stamp
TAG=install-compat
STAMP_SCRIPT=${BASH_SOURCE[0]}
OLDEST=$ROOT/requirements/oldest.txt
# shellcheck source=tools/install_lib.sh
source "$ROOT/tools/install_lib.sh"

if stamp_up_to_date; then
  log "up to date: $VENV"
  exit 0
fi
make_venv
pipo() { "$VPY" -m pip install --disable-pip-version-check -c "$OLDEST" "$@"; }

log "build tools, torch + torchvision (requirements/oldest.txt's pair)"
pipo -q -r "$ROOT/requirements/build.txt"
pipo -q torch torchvision

# mmcv's setup.py imports opencv, torch and a few helpers at build time
pipo -q "opencv-python>=4.10,<5" "addict" "yapf" "packaging" "pyyaml" "Pillow"
if ! mmcv_ok 2>/dev/null; then
  wheel=$(mmcv_wheel)
  log "mmcv from $wheel"
  pipo -q --no-deps --force-reinstall "$wheel"
fi

log "the oldest supported OpenMMLab stack (requirements/oldest.txt) and the test tools"
pipo -q "addict" "yapf" "packaging" "pyyaml" "Pillow" -r "$ROOT/requirements/runtime.txt" \
  -r "$ROOT/requirements/tests.txt"
# the jit ONNX exporter's check (tests/test_deploy_jit.py): onnx and ONNX Runtime, without onnxscript
# (which only torch >= 2.5's dynamo exporter uses)
pipo -q $(grep -E '^(onnx|onnxruntime)==' "$ROOT/requirements/deploy.txt")

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
"$VPY" -m pip freeze --all --exclude-editable | sort > "$before"
"$VPY" -m pip install -q --disable-pip-version-check --no-build-isolation -e "$ROOT"
"$VPY" -m pip freeze --all --exclude-editable | sort > "$after"
if ! diff -u "$before" "$after" >&2; then
  die "'pip install -e .' changed the installed stack (diff above): setup.py's ranges do not admit it"
fi
log "pip freeze unchanged by 'pip install -e .' ($(wc -l < "$after") distributions)"

mmcv_ok || die "mmcv's ops do not load (mmcv._ext)"
"$VPY" - <<'EOF' || die "an OpenMMLab package does not import"
import torch, mmcv
import mmdet, mmengine, mmpretrain, mmseg, numpy, torchvision, mmlinattn
print('[install-compat] stack: ' + ', '.join(f'{m.__name__} {m.__version__}' for m in (
    torch, torchvision, mmcv, mmengine, mmdet, mmseg, mmpretrain, numpy)), file=__import__('sys').stderr)
EOF
"$VPY" -m pip check >&2 || log "pip check reported the conflicts above"

echo "$want_stamp" > "$STAMP"
log "done: $VENV"
