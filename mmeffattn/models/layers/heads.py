"""The check every multi-head mixer makes of its width."""


def check_heads(dim: int, num_heads: int) -> int:
    """``dim // num_heads`` (the head dim); ``ValueError`` naming both when ``num_heads`` does not
    divide ``dim``."""
    if num_heads < 1 or dim % num_heads != 0:
        raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}: choose num_heads '
                         f'(arch "num_heads") that divides the stage width')
    return dim // num_heads
