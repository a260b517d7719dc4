"""Former home of what tools/train.py and tools/test.py share; the names now live in
:mod:`mmlinattn.apis` (pre-flight checks in :mod:`mmlinattn.apis.preflight`, the runner set-up in
:mod:`mmlinattn.apis.runner`) and stay importable from here."""
from .apis import (COCO_CHECK_MAX_BYTES, SEG_CHECK_ALL_MAX, SEG_CHECK_SAMPLE,  # noqa: F401
                   CfgOptionsAction, ConfigError, add_common_args, build_runner, check_cfg_options,
                   check_coco_annotations, check_data_paths, check_model_channels,
                   check_seg_annotations, close_distributed, enable_amp, load_config, model_registry,
                   parse_with_common_args, prepare_env, set_work_dir)
