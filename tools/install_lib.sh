#!/usr/bin/env bash
# Shared steps of tools/install.sh and tools/install_compat.sh; sourced, never run on its own.
#
# The caller sets ROOT, VENV, STAMP, TAG (the log prefix) and STAMP_SCRIPT (its own path, hashed into
# the stamp with this file, setup.py and requirements/*.txt) before sourcing; PYTHON may be preset.
# Afterwards the caller has: log / die, PYTHON (a 3.11 interpreter), stamp_up_to_date, make_venv
# (sets VPY), mmcv_wheel_dir (the cache folder of mmcv wheels built against the venv's torch, CPU or
# CUDA ops) and mmcv_ok (mmcv imports at MMCV_VERSION and its compiled NMS and RoIAlign run, on the
# GPU too where torch sees one).

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
# mmlinattn/version.py is setup.py's version: the editable install's metadata (pip show, mim list,
# importlib.metadata) is written at install time and would keep an old one.
want_stamp=$(cat "$STAMP_SCRIPT" "${BASH_SOURCE[0]}" "$ROOT/setup.py" "$ROOT/mmlinattn/version.py" \
  "$ROOT"/requirements/*.txt | sha256sum | cut -d' ' -f1)

# 0 when the venv was installed from exactly these files, still imports mmcv's ops and us, and its
# mmcv holds the ops this machine needs: CUDA ops where torch sees a GPU. A .venv built on a GPU-less
# login node (CPU-only ops) and then used on a GPU node is rebuilt here instead of failing at the
# first RoIAlign on the GPU. The other way round is kept: a CUDA build holds the CPU ops too, and a
# .venv shared between both kinds of node would otherwise be rebuilt at every switch.
stamp_up_to_date() {
  local kinds machine built
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] || return 1
  kinds=$("$VENV/bin/python" -c 'import torch, mmcv._ext, mmlinattn
from mmcv.ops import get_compiling_cuda_version as built
print("cuda" if torch.cuda.is_available() else "cpu", "cpu" if built() == "not available" else "cuda")
' 2>/dev/null) || return 1
  read -r machine built <<< "$kinds"
  if [[ "$machine" == cuda && "$built" != cuda ]]; then
    log "the installed mmcv has CPU-only ops but torch sees a GPU here: rebuilding it with CUDA ops"
    return 1
  fi
}

# The NVIDIA driver a CUDA major version's builds need (NVIDIA's CUDA Compatibility guide, "Minor
# Version Compatibility": CUDA 11.x >= 450, 12.x >= 525, 13.x >= 580); "?" for another version.
cuda_min_driver() {
  case ${1%%.*} in 11) echo 450 ;; 12) echo 525 ;; 13) echo 580 ;; *) echo '?' ;; esac
}

# The driver version nvidia-smi reports for the first GPU; empty where there is no nvidia-smi
# ($NVIDIA_SMI, default nvidia-smi on PATH), it fails, lists no GPU or takes over 10 s.
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
nvidia_driver_version() {
  local out
  command -v "$NVIDIA_SMI" >/dev/null 2>&1 || return 0
  out=$(timeout 10 "$NVIDIA_SMI" --query-gpu=driver_version --format=csv,noheader 2>/dev/null \
        | head -n1 | tr -d ' \r') || return 0
  [[ "$out" =~ ^[0-9]+(\.[0-9]+)*$ ]] && echo "$out"
  return 0
}

# Stops in one line where nvidia-smi lists a GPU that the venv's torch does not see: a driver older
# than torch's CUDA build needs (PyPI's torch 2.14.1 is a CUDA 13.0 build: driver >= 580), or a
# CPU-only torch. Without this the install finishes with CPU-only mmcv ops and training runs on the
# CPU without a word. CUDA_VISIBLE_DEVICES set and empty asks for a CPU install on purpose.
torch_sees_the_gpu() {
  local py=${VPY:-$VENV/bin/python} driver info avail cuda tv need why
  [[ "${CUDA_VISIBLE_DEVICES-unset}" == "" ]] && return 0
  driver=$(nvidia_driver_version)
  [[ -n "$driver" ]] || return 0
  info=$("$py" -c 'import torch
why = ""
if not torch.cuda.is_available():
    try:
        torch.cuda.init()
    except Exception as err:
        why = (str(err).strip().splitlines() or [""])[0][:200]
print(torch.cuda.is_available(), torch.version.cuda, torch.__version__, why)
') || die "torch does not import with $py"
  read -r avail cuda tv why <<< "$info"
  [[ "$avail" == True ]] && return 0
  local alt="or use OpenMMLab's prebuilt torch 2.1 + CUDA 12.1 stack (docs/install.md, driver >= 525), \
or install for the CPU on purpose with CUDA_VISIBLE_DEVICES= make install"
  if [[ "$cuda" == None ]]; then
    die "nvidia-smi lists a GPU (driver $driver) but torch $tv is a CPU-only build \
(torch.version.cuda None): reinstall the CUDA build of requirements/torch.txt (make clean-venv install), $alt"
  fi
  need=$(cuda_min_driver "$cuda")
  if [[ "$need" != '?' ]] && (( ${driver%%.*} < need )); then
    die "nvidia-smi lists a GPU (driver $driver) but torch $tv (torch.version.cuda $cuda) sees none: \
CUDA $cuda builds need an NVIDIA driver >= $need; update the driver, $alt"
  fi
  die "nvidia-smi lists a GPU (driver $driver) but torch $tv (torch.version.cuda $cuda) sees none \
(torch.cuda.init(): ${why:-no reason given}); check the node's GPU access (CUDA_VISIBLE_DEVICES, the \
container's devices), $alt"
}

# How many compile jobs mmcv's build runs: $MAX_JOBS when set; for CUDA ops one per 5 GiB of
# MemAvailable (an nvcc job on mmcv's kernels takes several GiB; $(nproc) of them exhaust a node's
# memory), at least 1 and at most nproc; for CPU ops nproc.
mmcv_build_jobs() {
  local kind=$1 cpus mem_kib jobs
  if [[ -n "${MAX_JOBS:-}" ]]; then echo "$MAX_JOBS"; return; fi
  cpus=$(nproc)
  if [[ "$kind" == cpu ]]; then echo "$cpus"; return; fi
  mem_kib=$(awk '/^MemAvailable:/ {print $2}' "${_MEMINFO:-/proc/meminfo}" 2>/dev/null || true)
  jobs=$(( ${mem_kib:-0} / (5 * 1024 * 1024) ))
  (( jobs >= 1 )) || jobs=1
  (( jobs <= cpus )) || jobs=$cpus
  echo "$jobs"
}

make_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtual environment $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
  fi
  VPY=$VENV/bin/python
}

# Which ops mmcv's setup.py compiles here: "cuda" when the venv's torch sees a GPU (mmcv 2.1.0
# then builds its CUDA kernels whatever FORCE_CUDA says), else "cpu".
mmcv_ops_kind() {
  "$VPY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")'
}

# The cache folder, keyed on torch version, python tag, machine and the ops it holds (cpu, or
# cuda<version>-sm<GPU architecture>), so that a wheel built against another torch or without CUDA kernels is never
# reused. A folder of an earlier release without the ops suffix held CPU ops: it is renamed.
mmcv_wheel_dir() {
  local torch_version pytag base kind
  torch_version=$("$VPY" -c 'import torch; print(torch.__version__)')
  pytag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  base="$CACHE_ROOT/wheels/mmcv-$MMCV_VERSION-torch$torch_version-$pytag-$(uname -m)"
  kind=$(mmcv_ops_kind)
  # CUDA: the toolkit version and the GPU's architecture the kernels are compiled for
  [[ "$kind" == cpu ]] || kind=$("$VPY" -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"cuda{torch.version.cuda}-sm{m}{n}")')
  if [[ "$kind" == cpu && -d "$base" && ! -e "$base-cpu" ]]; then
    mv "$base" "$base-cpu"
  fi
  echo "$base-$kind"
}

# mmcv imports at MMCV_VERSION and its compiled NMS and RoIAlign run on the CPU, and on the GPU
# too when torch sees one. Prints what failed (to stderr) and returns 1 otherwise.
mmcv_ok() {
  "$VPY" - <<PYEOF >&2
import sys
try:
    import mmcv, mmcv._ext, torch
    from mmcv.ops import nms, roi_align
    assert mmcv.__version__ == '$MMCV_VERSION', f'mmcv {mmcv.__version__}, not $MMCV_VERSION'
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    for dev in devices:
        b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]], device=dev)
        nms(b, torch.tensor([0.9, 0.8], device=dev), 0.5)
        rois = torch.tensor([[0., 0., 0., 4., 4.]], device=dev)
        roi_align(torch.ones(1, 2, 8, 8, device=dev), rois, (2, 2), 1.0, 0, 'avg', True)
except Exception as err:
    print(f'mmcv ops check: {type(err).__name__}: {err}'.splitlines()[0], file=sys.stderr)
    sys.exit(1)
PYEOF
}

# With a GPU visible, mmcv's setup.py compiles CUDA kernels: that needs nvcc of the CUDA major
# version torch was built with. Stops in one line naming what is missing.
mmcv_cuda_build_ready() {
  "$VPY" - <<'PYEOF' || exit 1
import os, re, subprocess, sys
import torch
from torch.utils.cpp_extension import CUDA_HOME
want = torch.version.cuda
if not want:
    sys.exit(0)
nvcc = os.path.join(CUDA_HOME, 'bin', 'nvcc') if CUDA_HOME else None
hint = (f'a GPU is visible, so mmcv {os.environ["MMCV_VERSION"]} builds its CUDA ops, which needs '
        f'nvcc of CUDA {want} (torch {torch.__version__}\'s)')
if not nvcc or not os.path.exists(nvcc):
    sys.exit(f'[install] ERROR: {hint}; none found: set CUDA_HOME to a CUDA {want} toolkit, or '
             'build CPU-only ops with CUDA_VISIBLE_DEVICES= make install')
out = subprocess.run([nvcc, '--version'], capture_output=True, text=True).stdout
have = re.search(r'release (\d+\.\d+)', out)
if not have or have.group(1).split('.')[0] != want.split('.')[0]:
    sys.exit(f'[install] ERROR: {hint}; {nvcc} is CUDA {have.group(1) if have else "?"}: set '
             f'CUDA_HOME to a CUDA {want} toolkit, or build CPU-only ops with '
             'CUDA_VISIBLE_DEVICES= make install')
PYEOF
}

# The mmcv wheel for the venv's torch: the cached one (mmcv_wheel_dir), else built from mmcv's source
# WITH its C++ ops and cached (~14 min on 2 cores). Prints the wheel's path. The C++ standard is the
# one the venv's torch compiles its own extensions with (torch.utils.cpp_extension: C++17 up to torch
# 2.x's early releases, C++20 for today's, whose headers need it); mmcv 2.1.0 hard-codes C++17.
mmcv_wheel() {
  local dir wheel work src std built kind jobs
  dir=$(mmcv_wheel_dir)
  wheel=$(ls "$dir"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)
  if [[ -n "$wheel" ]]; then
    log "using cached mmcv wheel $wheel"
    echo "$wheel"; return
  fi
  if [[ "$(mmcv_ops_kind)" == cuda ]]; then  # before any download: one line if nvcc is missing
    MMCV_VERSION=$MMCV_VERSION mmcv_cuda_build_ready
  fi
  log "building mmcv $MMCV_VERSION with ops against torch $("$VPY" -c 'import torch; print(torch.__version__)') (about 14 min on 2 cores)"
  work=$(mktemp -d)
  "$VPY" -m pip download -q --no-deps --no-binary mmcv --no-build-isolation -d "$work" \
    "mmcv==$MMCV_VERSION" >&2 || die "could not download the mmcv $MMCV_VERSION source"
  tar -xzf "$work"/mmcv-$MMCV_VERSION.tar.gz -C "$work"
  src=$work/mmcv-$MMCV_VERSION
  grep -q -- "-std=c++17" "$src/setup.py" || die "mmcv setup.py no longer has -std=c++17; revisit this patch"
  std=$("$VPY" - <<'PYEOF'
import re, torch.utils.cpp_extension as ext
found = sorted(set(re.findall(r'-std=c\+\+(\d+)', open(ext.__file__).read())), key=int)
print(found[-1] if found else '17')
PYEOF
)
  if [[ "$std" != 17 ]]; then
    sed -i "s/-std=c++17/-std=c++$std/g" "$src/setup.py"
  fi
  kind=$(mmcv_ops_kind)
  jobs=$(mmcv_build_jobs "$kind")
  log "compiling with -std=c++$std (the standard torch.utils.cpp_extension uses), $kind ops, $jobs jobs"
  mkdir -p "$dir"
  MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=$jobs \
    "$VPY" -m pip wheel --no-cache-dir --no-deps --no-build-isolation -w "$work/dist" "$src" >&2 \
    || { rm -rf "$work"; die "building mmcv $MMCV_VERSION failed (output above)"; }
  # write-then-rename so an interrupted build never leaves a half wheel in the cache
  built=$(ls "$work"/dist/mmcv-*.whl)
  cp "$built" "$dir/.tmp-$(basename "$built")"
  mv "$dir/.tmp-$(basename "$built")" "$dir/$(basename "$built")"
  rm -rf "$work"
  echo "$dir/$(basename "$built")"
}
