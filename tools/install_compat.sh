#!/usr/bin/env bash
# Builds a second environment, starting from the one OpenMMLab's install guide leaves for torch 2.1
# (the users' stack), installs mmlinattn into it the way docs/install.md tells users to, and checks
# that nothing installed changed; then moves it to the OLDEST supported OpenMMLab stack, where
# `make test-compat` runs a smoke subset of the tests.
#
#   bash tools/install_compat.sh     # creates ./.venv-compat (or $MMLINATTN_COMPAT_VENV)
#
# 1. The stock environment (STOCK below): torch 2.1.2 + torchvision 0.16.2, numpy 1.24.4,
#    opencv-python 4.8.1.78, mmengine 0.10.4 and mmcv 2.1.0 with its ops. A user has OpenMMLab's
#    prebuilt mmcv wheel; that server is not reachable here, so mmcv 2.1.0 is compiled against torch
#    2.1.2 instead (tools/install_lib.sh, mmcv_wheel: cached per torch version, python tag, machine
#    and ops; about 10 minutes once).
# 2. mmlinattn[all] (the three toolboxes: the tests use them all) into it as docs/install.md says: a
#    constraint file keeps torch, torchvision, numpy and opencv-python (what a plain
#    `pip install ".[all]"` would change instead is printed first).
#    `pip freeze --all` before and after are compared and the diff printed; a changed or removed
#    distribution fails the script, new ones (mmdet, mmseg, mmpretrain, ...) are listed.
# 3. The oldest supported stack for the tests: requirements/oldest.txt (mmengine 0.10.0, mmdet
#    3.2.0, mmsegmentation 1.2.1, mmpretrain 1.1.1; the torch, numpy and opencv-python of step 1)
#    and the test tools.
# The environment is built afresh whenever its stamp is stale, so step 2 always starts from step 1.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMLINATTN_COMPAT_VENV:-$ROOT/.venv-compat}
STAMP=$VENV/.mmlinattn-compat-stamp
TAG=install-compat
STAMP_SCRIPT=${BASH_SOURCE[0]}
OLDEST=$ROOT/requirements/oldest.txt
# what OpenMMLab's install guide leaves for torch 2.1 (and mmcv 2.1.0: step 1)
STOCK=(torch==2.1.2 torchvision==0.16.2 numpy==1.24.4 opencv-python==4.8.1.78 mmengine==0.10.4)
# shellcheck source=tools/install_lib.sh
source "$ROOT/tools/install_lib.sh"

if stamp_up_to_date; then
  log "up to date: $VENV"
  exit 0
fi
MARK=$VENV/.mmlinattn-compat-venv   # written into the environments this script creates
if [[ -e "$VENV" ]]; then
  [[ -f "$MARK" ]] || die "$VENV exists and was not created by tools/install_compat.sh; remove it \
or set MMLINATTN_COMPAT_VENV to another folder"
  log "removing the stale $VENV: the check starts from the stock environment"
  rm -rf "$VENV"
fi
make_venv
touch "$MARK"
pipq() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }
pipo() { pipq -c "$OLDEST" "$@"; }

log "1. the stock environment: ${STOCK[*]}, mmcv 2.1.0"
pipq -r "$ROOT/requirements/build.txt"
# with mmcv's own dependencies (the prebuilt wheel brings them; its setup.py imports them to build)
pipq "${STOCK[@]}" addict yapf packaging pyyaml Pillow
if ! mmcv_ok 2>/dev/null; then
  wheel=$(mmcv_wheel)
  log "mmcv from $wheel"
  pipq --no-deps --force-reinstall "$wheel"
fi
mmcv_ok || die "mmcv's ops do not load in the stock environment (mmcv._ext)"

log "2. mmlinattn into it, as docs/install.md says; it must change nothing installed"
before=$(mktemp); after=$(mktemp); keep=$(mktemp); report=$(mktemp)
trap 'rm -f "$before" "$after" "$keep" "$report"' EXIT
# What a plain 'pip install ".[all]"' would change, for information: the newest scipy and shapely
# that mmdet brings ask for numpy >= 1.26, so pip would replace numpy 1.24.4 with a numpy 2, which
# torch 2.1 and opencv-python 4.8 cannot use. docs/install.md's constraint file prevents it.
if pipq --dry-run --report "$report" "$ROOT[all]" >/dev/null 2>&1; then
  "$VPY" - "$report" <<'PYEOF' >&2
import json, sys
from importlib.metadata import PackageNotFoundError, version
changes = []
for item in json.load(open(sys.argv[1]))['install']:
    name, new = item['metadata']['name'], item['metadata']['version']
    try:
        changes.append(f'{name} {version(name)} -> {new}')
    except PackageNotFoundError:
        pass
print('[install-compat] a plain "pip install .[all]" (no constraint file) would change: '
      + (', '.join(changes) or 'nothing installed'))
PYEOF
else
  log "(the dry run of a plain 'pip install .[all]' failed; going on)"
fi
# docs/install.md's two commands
"$VPY" -m pip freeze --all | grep -iE '^(torch|torchvision|numpy|opencv-python)==' > "$keep"
"$VPY" -m pip freeze --all | sort > "$before"
pipq -c "$keep" "$ROOT[all]"
"$VPY" -m pip freeze --all | sort > "$after"
diff -u "$before" "$after" >&2 || true
"$VPY" - "$before" "$after" <<'PYEOF' || die "installing mmlinattn changed the stock environment \
(pip freeze diff above): setup.py's ranges (requirements/runtime.txt) do not admit it"
import re, sys
def dists(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith('#'):
            out[re.split(r'==| @ ', line)[0].lower().replace('_', '-')] = line
    return out
before, after = dists(sys.argv[1]), dists(sys.argv[2])
changed = [f'{before[n]} -> {after.get(n, "removed")}' for n in before if after.get(n) != before[n]]
added = sorted(after[n] for n in after if n not in before and n != 'mmlinattn')
kept = [before[n] for n in ('torch', 'numpy', 'opencv-python') if after.get(n) == before.get(n)]
print(f'[install-compat] unchanged: {", ".join(kept)}; added: {", ".join(added) or "none"}',
      file=sys.stderr)
sys.exit(f'[install-compat] changed: {"; ".join(changed)}' if changed else 0)
PYEOF
log "pip freeze: all $(wc -l < "$before") stock distributions unchanged"
# the tests import the checkout (pytest.ini: pythonpath = .); an editable install points the
# package's metadata there too, as in the main environment
pipq --no-deps --no-build-isolation -e "$ROOT"

log "3. the oldest supported OpenMMLab stack (requirements/oldest.txt) and the test tools"
pipo "addict" "yapf" "packaging" "pyyaml" "Pillow" -r "$ROOT/requirements/runtime.txt" \
  -r "$ROOT/requirements/det.txt" -r "$ROOT/requirements/seg.txt" -r "$ROOT/requirements/cls.txt" \
  -r "$ROOT/requirements/tests.txt"
# the jit ONNX exporter's check (tests/test_deploy_jit.py): onnx and ONNX Runtime, without onnxscript
# (which only torch >= 2.5's dynamo exporter uses)
pipo $(grep -E '^(onnx|onnxruntime)==' "$ROOT/requirements/deploy.txt")

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
