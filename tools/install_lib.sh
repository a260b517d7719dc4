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
# mmlinattn/version.py is setup.py's version: the editable install's metadata (pip show, mim list,
# importlib.metadata) is written at install time and would keep an old one.
want_stamp=$(cat "$STAMP_SCRIPT" "${BASH_SOURCE[0]}" "$ROOT/setup.py" "$ROOT/mmlinattn/version.py" \
  "$ROOT"/requirements/*.txt | sha256sum | cut -d' ' -f1)

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

# The mmcv wheel for the venv's torch: the cached one (mmcv_wheel_dir), else built from mmcv's source
# WITH its C++ ops and cached (~14 min on 2 cores). Prints the wheel's path. The C++ standard is the
# one the venv's torch compiles its own extensions with (torch.utils.cpp_extension: C++17 up to torch
# 2.x's early releases, C++20 for today's, whose headers need it); mmcv 2.1.0 hard-codes C++17.
mmcv_wheel() {
  local dir wheel work src std built
  dir=$(mmcv_wheel_dir)
  wheel=$(ls "$dir"/mmcv-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)
  if [[ -n "$wheel" ]]; then
    log "using cached mmcv wheel $wheel"
    echo "$wheel"; return
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
  log "compiling with -std=c++$std (the standard torch.utils.cpp_extension uses)"
  mkdir -p "$dir"
  MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    "$VPY" -m pip wheel --no-cache-dir --no-deps --no-build-isolation -w "$work/dist" "$src" >&2 \
    || { rm -rf "$work"; die "building mmcv $MMCV_VERSION failed (output above)"; }
  # write-then-rename so an interrupted build never leaves a half wheel in the cache
  built=$(ls "$work"/dist/mmcv-*.whl)
  cp "$built" "$dir/.tmp-$(basename "$built")"
  mv "$dir/.tmp-$(basename "$built")" "$dir/$(basename "$built")"
  rm -rf "$work"
  echo "$dir/$(basename "$built")"
}
