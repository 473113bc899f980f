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
