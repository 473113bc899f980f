"""Tar: members of a byte stream (:mod:`.members`) grouped into samples by key (:mod:`.samples`)."""

from .headers import read_error
from .samples import Sample, iter_samples, split_name

__all__ = ["Sample", "iter_samples", "read_error", "split_name"]
