"""No silent CPU training on a GPU machine.

Where ``nvidia-smi`` lists a GPU but torch sees none - typically a driver older than torch's CUDA
build needs (PyPI's torch 2.14.1 is a CUDA 13.0 build: driver >= 580) - a training run would go
on on the CPU, hundreds of times slower, without a word. :func:`check_gpu_visible_to_torch` stops
it first, in one line, unless the config allows a CPU run (``allow_cpu = True``, e.g.
``--cfg-options allow_cpu=True``) or the GPUs are hidden on purpose (``CUDA_VISIBLE_DEVICES=``).

It costs nothing where torch sees a GPU: ``nvidia-smi`` is asked only when
``torch.cuda.is_available()`` is False, with a short timeout, and a missing or failing
``nvidia-smi`` means "no GPU".
"""
import os
import re
import shutil
import subprocess
from typing import Optional

import torch

__all__ = ['ALLOW_CPU_KEY', 'check_gpu_visible_to_torch', 'cuda_min_driver',
           'nvidia_driver_version']

#: the config key that allows a CPU run on a machine with a GPU torch cannot see
ALLOW_CPU_KEY = 'allow_cpu'
#: the program asked (looked up on PATH)
NVIDIA_SMI = 'nvidia-smi'
#: seconds nvidia-smi may take (it can take a few without the persistence daemon)
TIMEOUT_S = 10.0
#: the NVIDIA driver each CUDA major version's builds need (NVIDIA's CUDA Compatibility guide,
#: "Minor Version Compatibility")
CUDA_MIN_DRIVER = {11: 450, 12: 525, 13: 580}


def cuda_min_driver(cuda: Optional[str]) -> Optional[int]:
    """The driver major version a torch built with CUDA ``cuda`` ('13.0') needs, or None."""
    try:
        return CUDA_MIN_DRIVER.get(int(str(cuda).split('.')[0]))
    except ValueError:
        return None


def nvidia_driver_version(timeout_s: Optional[float] = None) -> Optional[str]:
    """The driver version ``nvidia-smi`` reports for the first GPU; None when there is no
    nvidia-smi, it fails, lists no GPU or takes longer than ``timeout_s`` (:data:`TIMEOUT_S`)."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    exe = shutil.which(NVIDIA_SMI)
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, '--query-gpu=driver_version', '--format=csv,noheader'],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    first = lines[0].strip()
    return first if re.fullmatch(r'\d+(\.\d+)*', first) else None


def check_gpu_visible_to_torch(cfg) -> None:
    """``ValueError`` in one line where ``nvidia-smi`` lists a GPU that torch does not see, unless
    ``cfg`` says ``allow_cpu=True`` or ``CUDA_VISIBLE_DEVICES`` is set and empty (GPUs hidden on
    purpose). The line names the driver, ``torch.version.cuda``, the driver that build needs and
    how to train on the CPU anyway."""
    if torch.cuda.is_available():
        return
    if cfg.get(ALLOW_CPU_KEY, False) or os.environ.get('CUDA_VISIBLE_DEVICES') == '':
        return
    driver = nvidia_driver_version()
    if driver is None:
        return
    cuda = torch.version.cuda
    need = cuda_min_driver(cuda)
    head = (f'nvidia-smi lists a GPU (driver {driver}) but torch {torch.__version__} '
            f'(torch.version.cuda {cuda}) sees none, so this run would train on the CPU')
    if cuda is None:
        why = 'this torch is a CPU-only build: install a CUDA build of torch (docs/install.md)'
    elif need is not None and int(driver.split('.')[0]) < need:
        why = (f'CUDA {cuda} builds need an NVIDIA driver >= {need}: update the driver, or '
               'install a torch built for an older CUDA (docs/install.md)')
    else:
        why = ('the driver is new enough for this build: check the GPU access '
               '(CUDA_VISIBLE_DEVICES, the container\'s devices; python -c "import torch; '
               'torch.cuda.init()" says why)')
    raise ValueError(f'{head}: {why}; to train on the CPU anyway, pass --cfg-options '
                     f'{ALLOW_CPU_KEY}=True (or set CUDA_VISIBLE_DEVICES= to hide the GPUs)')
