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
# mmcv 2.1.0 has no wheel for this torch, so it is compiled here (~14 min on 2 cores; tools/install_lib.sh,
# mmcv_wheel). The wheel is cached under ${XDG_CACHE_HOME:-~/.cache}/mmlinattn/wheels/, keyed on the torch version, python tag,
# machine and ops (cpu, or cuda<version>-sm<arch> where torch sees a GPU: mmcv's setup.py then builds
# CUDA kernels, and the nvcc it needs is checked first), so a wheel built against another torch is
# never reused. A CUDA build runs one compile job per 5 GiB of available memory (MAX_JOBS overrides).
# Where nvidia-smi lists a GPU that torch does not see (torch 2.14.1 is a CUDA 13.0 build: it needs
# an NVIDIA driver >= 580), the install stops in one line instead of building CPU-only ops;
# CUDA_VISIBLE_DEVICES= make install installs for the CPU on purpose. A second run with nothing
# changed only checks a stamp, imports mmcv's ops and checks that they are CUDA ops where torch
# sees a GPU: a few seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMLINATTN_VENV:-$ROOT/.venv}
STAMP=$VENV/.mmlinattn-install-stamp
TAG=install
STAMP_SCRIPT=${BASH_SOURCE[0]}
# shellcheck source=tools/install_lib.sh
source "$ROOT/tools/install_lib.sh"

if stamp_up_to_date; then
  torch_sees_the_gpu
  log "up to date: $VENV"
  exit 0
fi
make_venv
pipi() { "$VPY" -m pip install --disable-pip-version-check -c "$ROOT/requirements/constraints.txt" "$@"; }

log "build tools"
pipi -q -r "$ROOT/requirements/build.txt"
log "torch + torchvision (large: a CUDA build that also runs on the CPU)"
pipi -q -r "$ROOT/requirements/torch.txt"
# a GPU that nvidia-smi lists and torch does not see stops here, before a CPU-only mmcv is built
torch_sees_the_gpu

if ! mmcv_ok 2>/dev/null; then
  # mmcv's setup.py imports opencv, torch and a few helpers at build time
  pipi -q "opencv-python>=4.10,<5" "addict" "yapf" "packaging" "pyyaml" "Pillow"
  wheel=$(mmcv_wheel)
  pipi -q --no-deps --force-reinstall "$wheel"
fi

log "OpenMMLab packages and their undeclared dependencies (runtime.txt's ranges and the [all] extra's: det.txt, seg.txt, cls.txt; constraints.txt's pins)"
pipi -q -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/det.txt" \
  -r "$ROOT/requirements/seg.txt" -r "$ROOT/requirements/cls.txt"
log "test tools"
pipi -q -r "$ROOT/requirements/tests.txt"
log "deployment extras: onnx, onnxscript, onnxruntime (tools/deployment/export_onnx.py)"
pipi -q -r "$ROOT/requirements/deploy.txt"
log "mmlinattn[all] (editable; its requirements are installed above)"
pipi -q --no-deps --no-build-isolation -e "$ROOT[all]"

mmcv_ok || die "mmcv ops do not load after install (mmcv._ext); remove $(mmcv_wheel_dir) and rerun"
"$VPY" -c 'import mmdet, mmseg, mmpretrain, mmlinattn' || die "an OpenMMLab package does not import"
"$VPY" -m pip check >&2 || log "pip check reported the conflicts above (mmdet/mmseg/mmpretrain pins; known harmless)"

echo "$want_stamp" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
