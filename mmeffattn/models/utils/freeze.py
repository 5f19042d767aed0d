"""``frozen_stages`` and ``norm_eval`` the OpenMMLab way, shared by every backbone family."""
from typing import List

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


class FreezeStagesMixin:
    """Re-applies freezing in every ``train()`` call: modules from :meth:`frozen_modules` go to
    eval mode with ``requires_grad=False``; with ``norm_eval`` all BatchNorm layers, and the
    layers that declare ``running_statistics = True`` (LaplacianFormer's whitening, whichever
    family's blocks hold it), stay in eval.

    Subclasses set ``frozen_stages`` and ``norm_eval`` and implement :meth:`frozen_modules`.
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
