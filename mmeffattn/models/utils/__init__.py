from .pretrained import StrictPretrainedMixin, clip_keys, unwrap_state_dict

__all__ = ['StrictPretrainedMixin', 'clip_keys', 'unwrap_state_dict']
