"""Distributed training and testing without CUDA (CPU clusters, CI), through mmengine as usual.

mmengine 0.10's distributed path assumes GPUs: ``init_dist`` calls ``torch.cuda.set_device``, the
Runner passes ``device_ids=[LOCAL_RANK]`` to DDP, and torch's ``SyncBatchNorm`` only runs on GPUs.
On a machine without CUDA, ``tools/train.py`` / ``tools/test.py`` with a launcher therefore

1. open the process group themselves with the gloo backend (:func:`init_cpu_process_group`), so the
   Runner finds it initialised and skips its CUDA-only ``init_dist``;
2. wrap the model with :class:`CPUDistributedDataParallel` (mmengine's DDP wrapper without
   ``device_ids``), which turns SyncBN layers back into BatchNorm with one log line - each process
   then normalises its own batch, exactly as in single-process runs.

Nothing changes when CUDA is available: the GPU path is mmengine's own.
"""
import datetime
import os
import subprocess

import torch
import torch.distributed as dist
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from mmengine.registry import MODEL_WRAPPERS

__all__ = ['CPUDistributedDataParallel', 'init_cpu_process_group', 'use_cpu_ddp']


def _has_sync_bn(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.SyncBatchNorm) or type(m).__name__ == 'SyncBatchNorm'
               for m in module.modules())


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """mmengine's ``MMDistributedDataParallel`` for CPU processes: no ``device_ids``, SyncBN
    reverted.

    Takes the same arguments (``broadcast_buffers``, ``find_unused_parameters``, ...); the
    ``device_ids`` / ``output_device`` the Runner adds for GPUs are ignored.
    """

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if _has_sync_bn(module):
            module = revert_sync_batchnorm(module)
            print_log('CPU distributed run: SyncBatchNorm layers reverted to BatchNorm (torch runs '
                      'SyncBatchNorm on GPUs only); each process normalises its own batch',
                      logger='current')
        super().__init__(module=module, device_ids=None, output_device=None, **kwargs)


#: what each launcher's processes find in their environment (mmengine's ``init_dist`` reads these),
#: and how they are started
LAUNCHER_ENV = {
    'pytorch': (('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'),  # LOCAL_RANK: --local_rank
                'start the script through torchrun (tools/dist_train.sh CONFIG GPUS)'),
    'slurm': (('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'),
              'start the script under srun (tools/slurm_train.sh PARTITION JOB_NAME CONFIG '
              'WORK_DIR)'),
    'mpi': (('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK',
             'MASTER_ADDR'), 'start the script through Open MPI\'s mpirun, MASTER_ADDR set'),
}


def check_launcher_env(launcher: str) -> None:
    """``ValueError`` in one line naming the variables ``launcher`` needs that are not set, and how
    its processes are started (mmengine's own ``init_dist`` raises a bare ``KeyError``)."""
    names, how = LAUNCHER_ENV.get(launcher, ((), ''))
    # without CUDA our own process-group setup takes MASTER_ADDR in place of the node list
    # (mmengine's GPU path reads the node list in any case)
    missing = [n for n in names if n not in os.environ
               and not (n == 'SLURM_NODELIST' and 'MASTER_ADDR' in os.environ
                        and not torch.cuda.is_available())]
    if missing:
        raise ValueError(f'--launcher {launcher}: {", ".join(missing)} '
                         f'{"is" if len(missing) == 1 else "are"} not set; {how}')


def _slurm_env() -> None:
    """Fill the torchrun variables from a slurm allocation (one task per process)."""
    proc_id, ntasks = int(os.environ['SLURM_PROCID']), int(os.environ['SLURM_NTASKS'])
    os.environ.setdefault('RANK', str(proc_id))
    os.environ.setdefault('WORLD_SIZE', str(ntasks))
    os.environ.setdefault('LOCAL_RANK', os.environ.get('SLURM_LOCALID', '0'))
    if 'MASTER_ADDR' not in os.environ:
        nodes = os.environ['SLURM_NODELIST']
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {nodes} | head -n1').strip()
    os.environ.setdefault('MASTER_PORT', '29500')


def init_cpu_process_group(launcher: str, timeout_s: float = 1800) -> None:
    """Open the default process group with gloo for ``launcher`` 'pytorch' (torchrun) or 'slurm'."""
    if dist.is_available() and dist.is_initialized():
        return
    if launcher == 'slurm':
        _slurm_env()
    elif launcher != 'pytorch':
        raise ValueError(f'--launcher {launcher} without CUDA: use torchrun (tools/dist_train.sh, '
                         '--launcher pytorch) or slurm (tools/slurm_train.sh)')
    missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
               if k not in os.environ]
    if missing:
        raise ValueError(f'--launcher {launcher}: environment variables {missing} are not set; '
                         'start the script through tools/dist_train.sh / dist_test.sh (torchrun)')
    dist.init_process_group('gloo', rank=int(os.environ['RANK']),
                            world_size=int(os.environ['WORLD_SIZE']),
                            timeout=datetime.timedelta(seconds=timeout_s))


def use_cpu_ddp(cfg) -> None:
    """Point ``cfg.model_wrapper_cfg`` at :class:`CPUDistributedDataParallel`, keeping its
    options."""
    wrapper = cfg.get('model_wrapper_cfg')
    if wrapper is None:
        wrapper = dict(broadcast_buffers=False,
                       find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper = dict(wrapper)
    if wrapper.get('type', 'MMDistributedDataParallel') in ('MMDistributedDataParallel',
                                                            'DistributedDataParallel'):
        wrapper['type'] = 'CPUDistributedDataParallel'
    cfg.model_wrapper_cfg = wrapper
