#!/usr/bin/env bash
# Idempotent installer for mmlinattn and the OpenMMLab stack it runs on.
#
#   bash tools/install.sh            # creates ./.venv (or $MMLINATTN_VENV) and installs everything
#
# The stack (measured to work together, see docs/design.md, "The stack"):
#   Python 3.11, torch 2.14.1 + torchvision 0.29.1, mmcv 2.1.0 built from source WITH its C++ ops,
#   mmengine 0.10.7, mmdet 3.3.0, mmsegmentation 1.2.2, mmpretrain 1.2.0, numpy 2.x.
# requirements/runtime.txt holds the version RANGES setup.py declares; the exact versions above are
# the pins of requirements/constraints.txt, which every pip call here applies (-c). The oldest end of
# the ranges is tools/install_compat.sh's (`make test-compat`).
#
# mmcv 2.1.0 has no wheel for this torch, so it is compiled here (~14 min on 2 cores). The wheel is
# cached under ${XDG_CACHE_HOME:-~/.cache}/mmlinattn/wheels/, keyed on the torch version, python tag and
# machine, so a wheel built against another torch is never reused. A second run with nothing changed
# only checks a stamp and imports mmcv's ops: a few seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMLINATTN_VENV:-$ROOT/.venv}
STAMP=$VENV/.mmlinattn-install-stamp
TAG=install
STAMP_SCRIPT=${BASH_SOURCE[0]}
# shellcheck source=tools/install_lib.sh
source "$ROOT/tools/install_lib.sh"

if stamp_up_to_date; then
  log "up to date: $VENV"
  exit 0
fi
make_venv
pipi() { "$VPY" -m pip install --disable-pip-version-check -c "$ROOT/requirements/constraints.txt" "$@"; }

log "build tools"
pipi -q -r "$ROOT/requirements/build.txt"
log "torch + torchvision (large: a CUDA build that also runs on the CPU)"
pipi -q -r "$ROOT/requirements/torch.txt"

WHEEL_DIR=$(mmcv_wheel_dir)
TORCH_VERSION=$("$VPY" -c 'import torch; print(torch.__version__)')

if ! mmcv_ok; then
  wheel=$(ls "$WHEEL_DIR"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)
  if [[ -z "$wheel" ]]; then
    log "building mmcv $MMCV_VERSION with ops against torch $TORCH_VERSION (about 14 min on 2 cores)"
    # mmcv's setup.py imports mmengine-free helpers, opencv and torch at build time
    pipi -q "opencv-python>=4.10,<5" "addict" "yapf" "packaging" "pyyaml" "Pillow"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$VPY" -m pip download -q -c "$ROOT/requirements/constraints.txt" --no-deps --no-binary mmcv --no-build-isolation \
      -d "$work" "mmcv==$MMCV_VERSION" || die "could not download the mmcv $MMCV_VERSION source"
    tar -xzf "$work"/mmcv-$MMCV_VERSION.tar.gz -C "$work"
    src=$work/mmcv-$MMCV_VERSION
    # torch 2.14's headers need C++20; mmcv 2.1.0 hard-codes -std=c++17.
    grep -q -- "-std=c++17" "$src/setup.py" || die "mmcv setup.py no longer has -std=c++17; revisit this patch"
    sed -i 's/-std=c++17/-std=c++20/g' "$src/setup.py"
    mkdir -p "$WHEEL_DIR"
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
      "$VPY" -m pip wheel --no-cache-dir --no-deps --no-build-isolation -w "$work/dist" "$src"
    # write-then-rename so an interrupted build never leaves a half wheel in the cache
    built=$(ls "$work"/dist/mmcv-*.whl)
    cp "$built" "$WHEEL_DIR/.tmp-$(basename "$built")"
    mv "$WHEEL_DIR/.tmp-$(basename "$built")" "$WHEEL_DIR/$(basename "$built")"
    wheel=$WHEEL_DIR/$(basename "$built")
  else
    log "using cached mmcv wheel $wheel"
  fi
  pipi -q --no-deps --force-reinstall "$wheel"
  pipi -q "addict" "yapf" "packaging" "pyyaml" "Pillow" "opencv-python>=4.10,<5"
fi

log "OpenMMLab packages and their undeclared dependencies (runtime.txt's ranges, constraints.txt's pins)"
pipi -q -r "$ROOT/requirements/runtime.txt"
log "test tools"
pipi -q -r "$ROOT/requirements/tests.txt"
log "deployment extras: onnx, onnxscript, onnxruntime (tools/deployment/export_onnx.py)"
pipi -q -r "$ROOT/requirements/deploy.txt"
log "mmlinattn (editable)"
pipi -q --no-deps --no-build-isolation -e "$ROOT"

mmcv_ok || die "mmcv ops do not load after install (mmcv._ext); remove $WHEEL_DIR and rerun"
"$VPY" -c 'import mmdet, mmseg, mmpretrain, mmlinattn' || die "an OpenMMLab package does not import"
"$VPY" -m pip check >&2 || log "pip check reported the conflicts above (mmdet/mmseg/mmpretrain pins; known harmless)"

echo "$want_stamp" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
