from . import layers  # noqa: F401
from .backbones import *  # noqa: F401,F403
from .distill import VECADistiller  # noqa: F401
