"""Buckets: batches by shape (see :mod:`dalistream.plan.shapes`, where the values live, below the
config that carries them). :class:`AspectBuckets` chooses each sample's target size by its
aspect ratio, :class:`LengthBuckets` its length; :func:`parse_buckets` reads a command line's
``--buckets``."""

from .plan.shapes import (AREA_TOLERANCE, MAX_BUCKETS, PER, AspectBuckets, LengthBuckets, check_stream, missing_keys,
                          parse_buckets)

__all__ = ["AREA_TOLERANCE", "MAX_BUCKETS", "PER", "AspectBuckets", "LengthBuckets", "check_stream", "missing_keys",
           "parse_buckets"]
