from dalistream.tools import parse_bench

from helpers import key_shards


def test_parse_bench_counts_every_sample_both_ways(tmp_path, capsys):
    paths = key_shards(str(tmp_path), [5, 7])
    parse_bench.main(paths + ["--repeats", "1", "--fields", "label=cls,raw=bin"])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["parse", "decoded"]
    assert all(" 12 samples" in line for line in out)
