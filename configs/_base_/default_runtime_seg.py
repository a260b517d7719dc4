# mmseg's runtime + our registration (custom_imports) for every segmentation config.
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(imports=['mmlinattn'], allow_failed_imports=False)
