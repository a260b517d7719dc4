"""What the tools call around a run: the pre-flight (:func:`preflight`, one ordered pass over the
datasets and the model, see :mod:`.preflight`), the runner set-up of tools/train.py and
tools/test.py (:mod:`.runner`), the work-dir lock (:mod:`.workdir_lock`), the ``--resume`` search
(:mod:`.resume`), naming an unreadable data file (:mod:`.datafaults`), segmentation of large images
without full-size float logits (:mod:`.seg_postprocess`), and running tools in subprocesses and
reading the metrics mmengine records for them (:mod:`.runs`).

A run under mmdet's / mmseg's own tools has none of these; what a config needs there lives in
:mod:`mmlinattn.training`."""
from .config import ConfigError, model_registry
from .preflight import (
    COCO_CHECK_MAX_BYTES,
    SEG_CHECK_ALL_MAX,
    SEG_CHECK_SAMPLE,
    CfgOptionsAction,
    DatasetView,
    check_cfg_options,
    check_coco_annotations,
    check_model_channels,
    check_num_classes,
    check_seg_annotations,
    dataset_views,
    preflight,
)
from .runner import (
    add_common_args,
    build_runner,
    close_distributed,
    config_from_args,
    enable_amp,
    load_config,
    parse_with_common_args,
    prepare_env,
    set_work_dir,
    tool_error,
)
from .runs import ToolFailed, read_metrics, read_scalars, run_script

__all__ = [
    'ConfigError', 'model_registry', 'CfgOptionsAction', 'check_cfg_options', 'preflight',
    'DatasetView', 'dataset_views', 'check_coco_annotations', 'check_seg_annotations',
    'check_model_channels', 'check_num_classes', 'COCO_CHECK_MAX_BYTES', 'SEG_CHECK_ALL_MAX',
    'SEG_CHECK_SAMPLE', 'add_common_args', 'parse_with_common_args', 'load_config', 'set_work_dir',
    'prepare_env', 'config_from_args', 'enable_amp', 'build_runner', 'close_distributed',
    'tool_error', 'ToolFailed', 'run_script', 'read_scalars', 'read_metrics'
]
