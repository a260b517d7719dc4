# mmseg's runtime + our registration and mmengine's fixes for torch >= 2.6 (custom_imports:
# mmlinattn.upstream_fixes) for every segmentation config.
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn', 'mmlinattn.upstream_fixes'], allow_failed_imports=False)
