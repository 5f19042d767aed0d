"""``frozen_stages`` and ``norm_eval`` the OpenMMLab way, shared by every backbone family."""
from typing import List

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


class FreezeStagesMixin:
    """Re-applies freezing in every ``train()``: :meth:`frozen_modules` go to eval mode without
    gradients; with ``norm_eval`` BatchNorms and layers with ``running_statistics = True`` stay
    in eval. Subclasses set ``frozen_stages``, ``norm_eval`` and :meth:`frozen_modules`.
    """

    def frozen_modules(self) -> List[nn.Module]:
        raise NotImplementedError

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        for m in self.frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm) or getattr(m, 'running_statistics', False):
                    m.eval()
        return self
