from dalistream.tools import parse_bench

from helpers import key_shards


def test_parse_bench_counts_every_sample_every_way(tmp_path, capsys):
    paths = key_shards(str(tmp_path), [5, 7])
    parse_bench.main(paths + ["--repeats", "1", "--fields", "label=cls,raw=bin"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 shards, 2 with a member layout (sliced below; the others by header)"
    assert [line.split(":")[0] for line in out[1:]] == ["parse", "sliced", "decoded", "decoded, sliced"]
    assert all(" 12 samples" in line for line in out[1:])
