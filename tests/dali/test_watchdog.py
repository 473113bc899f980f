"""How DALI's workers are started (the failure handling is in test_faults.py)."""


import pytest

from dalistream import ConfigError, Stream
from dalistream.device import start_method

from helpers import key_shards


def test_auto_forks_cpu_pipelines_and_spawns_gpu_ones():
    assert start_method("auto", "cpu") == "fork"  # no CUDA in this test process
    assert start_method("auto", "gpu") == "spawn"
    assert start_method("spawn", "cpu") == "spawn"
    assert start_method("fork", "gpu") == "fork"  # asked for: DALI itself refuses once CUDA is up
    with pytest.raises(ConfigError, match="start_method"):
        start_method("forkserver", "cpu")


def test_stream_checks_and_shows_the_start_method(tmp_path):
    key_shards(str(tmp_path), [3, 3])
    stream = Stream.open(str(tmp_path), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                         start_method="spawn", cache_dir=str(tmp_path / "cache"))
    assert stream.start_method == "spawn" and "start_method='spawn'" in repr(stream)
    with pytest.raises(ConfigError, match="start_method"):
        Stream.open(str(tmp_path), fields={"key": "__key__"}, batch_size=2, workers=1, device="cpu",
                    start_method="thread", cache_dir=str(tmp_path / "cache"))
