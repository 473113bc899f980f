"""Tar: members of a byte stream (:mod:`.members`) grouped into samples by key (:mod:`.samples`)."""

from .members import Member, iter_members, read_error
from .samples import Sample, iter_samples, split_name

__all__ = ["Member", "Sample", "iter_members", "iter_samples", "read_error", "split_name"]
