"""SplitMix64 (Steele, Lea & Flood 2014): the counter-based generator the CPU kernels draw from (Dropout's
mask, the gaussian fill), in NumPy or CuPy. Output number k of the stream started at `seed` depends only on
(seed, k), so any range of a stream is computed on its own, on any thread count; kernels/_splitmix.pxi is the
same generator in C.
"""
from __future__ import annotations

import numpy as np

GAMMA = np.uint64(0x9E3779B97F4A7C15)


def outputs(seed: int, numbers):
    """SplitMix64 outputs number `numbers` (a uint64 array, from 1) of the stream started at seed."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + numbers * GAMMA
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
