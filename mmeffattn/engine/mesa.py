"""``MESAHook``: mmengine's ``EMAHook`` that also hands the EMA model to the MESA loss term
(:mod:`mmeffattn.models.distill.mesa`) from ``start_ratio`` of the schedule on."""
from mmengine.hooks import EMAHook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop

__all__ = ['MESAHook']


@HOOKS.register_module()
class MESAHook(EMAHook):
    """EMA of the weights (``EMAHook``'s arguments, e.g. ``momentum``) plus MLLA's MESA term.

    Args:
        mesa_weight: weight of the MESA term (MLLA: 1.0 for T, 1.5 for S, 2.0 for B).
        start_ratio: the term is on from epoch ``int(start_ratio * max_epochs)`` (epoch-based
            loops, as MLLA) or iteration ``int(start_ratio * max_iters)``.
        **kwargs: ``EMAHook``'s (``momentum``, ``update_buffers``, ``begin_iter``, ...).
    """

    def __init__(self, mesa_weight: float = 1.0, start_ratio: float = 0.25, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(mesa_weight, bool) or not isinstance(mesa_weight, (int, float)) or \
                not mesa_weight >= 0:
            raise ValueError(f'MESAHook: mesa_weight must be a number >= 0, got {mesa_weight!r}')
        if isinstance(start_ratio, bool) or not isinstance(start_ratio, (int, float)) or \
                not 0 <= start_ratio <= 1:
            raise ValueError(f'MESAHook: start_ratio must be in [0, 1], got {start_ratio!r}')
        self.mesa_weight, self.start_ratio = float(mesa_weight), float(start_ratio)

    @staticmethod
    def _student(runner):
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        if not hasattr(self._student(runner), 'set_mesa_teacher'):
            raise TypeError(f"MESAHook: the model ({type(self._student(runner)).__name__}) has no "
                            f"MESA term; use model.type='mmeffattn.MESAClassifier', or "
                            f"dict(type='EMAHook') for the weight average alone")
        super().before_run(runner)

    def _mesa_on(self, runner) -> bool:
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            return runner.epoch >= int(self.start_ratio * runner.max_epochs)
        return runner.iter >= int(self.start_ratio * runner.max_iters)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        student = self._student(runner)
        if self.mesa_weight > 0 and self._mesa_on(runner):
            teacher = self.ema_model.module
            teacher.eval()  # as MLLA's timm ModelEma: no dropout, no stochastic depth
            student.set_mesa_teacher(teacher, self.mesa_weight)
        else:
            student.set_mesa_teacher(None)

    def after_train(self, runner) -> None:
        self._student(runner).set_mesa_teacher(None)
