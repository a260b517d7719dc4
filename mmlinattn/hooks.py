"""Hooks for training with mmengine's Runner."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class PlainParamGroupsHook(Hook):
    """Make the optimizer's param groups plain ``dict`` objects before the first step.

    mmengine's optimizer constructor leaves each param group as a ``ConfigDict``. With
    ``compile=True``, mmengine compiles the whole ``train_step``, optimizer step included, and
    torch 2.14's dynamo stops there with ``AttributeError: 'UserDefinedDictVariable' object has no
    attribute 'items'``, because it can only trace plain dict param groups. This hook replaces each
    group with a plain dict of the same entries. Learning rates, schedules and the optimizer state are
    unchanged. ``tools/train.py`` adds the hook whenever the config sets ``compile``. With upstream
    tools, add ``custom_hooks = [dict(type='PlainParamGroupsHook')]`` to the config.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            wrappers = list(wrapper.values())
        elif isinstance(wrapper, OptimWrapper):
            wrappers = [wrapper]
        else:  # not built (test / val runs)
            return
        for w in wrappers:
            opt = w.optimizer
            opt.param_groups[:] = [g if type(g) is dict else dict(g) for g in opt.param_groups]
