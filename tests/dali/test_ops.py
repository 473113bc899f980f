import pytest

from dalistream import ops
from dalistream.errors import ConfigError


def test_device_switch():
    if ops.gpu_count() == 0:
        assert ops.resolve_device("auto") == ("cpu", None)
        with pytest.raises(ConfigError, match="no CUDA device"):
            ops.resolve_device("gpu")
    else:
        assert ops.resolve_device("auto", 0) == ("gpu", 0)
    assert ops.resolve_device("cpu", 3) == ("cpu", None)  # CPU graphs never get a device id
    with pytest.raises(ConfigError):
        ops.resolve_device("tpu")


def test_library_ops_are_kept_out_of_autograph():
    """DALI's AutoGraph rewrites every function a pipeline calls unless it is marked (30–200 ms
    each): only the code with an `if` on data is converted, and that is converted wherever it is
    called from."""
    from nvidia.dali._conditionals import _autograph

    from dalistream.dali import graph, pipeline
    from dalistream.dali import ops as dali_ops

    for fn in (ops.decode_images, ops.random_resized_crop, ops.resize_shorter, ops.normalize, ops.coin_flip,
               ops.color_jitter, ops.to_device, graph.sharded_sources, pipeline.read, pipeline._check_outputs,
               dali_ops._decode_valid, pipeline._merge):
        assert _autograph.is_autograph_artifact(fn), fn.__name__
    assert not _autograph.is_autograph_artifact(graph.merge)
