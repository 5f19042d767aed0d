"""Cost analysis shared by the tools and the tests: FLOP counting that understands mmeffattn's
ops (:mod:`.flops`), the benchmarked models (:mod:`.model_zoo`) and their timing side by side
(:mod:`.benchmarking`), attention dispersion statistics and probing (:mod:`.dispersion`); and
reading training logs (:mod:`.logs`)."""
from .flops import CountedForward, FlopCount, count_flops, op_macs, register_op_counter
from .model_zoo import MODEL_ZOO, build_backbone, build_classifier, unavailable_reason

__all__ = ['CountedForward', 'FlopCount', 'count_flops', 'op_macs', 'register_op_counter',
           'MODEL_ZOO', 'build_backbone', 'build_classifier', 'unavailable_reason']
