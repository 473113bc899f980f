"""Tar: members of a byte stream (:mod:`.members`) grouped into samples by key (:mod:`.samples`)."""

from .headers import read_error
from .members import Member, iter_members
from .samples import Sample, iter_samples, split_name

__all__ = ["Member", "Sample", "iter_members", "iter_samples", "read_error", "split_name"]
