"""Local shards and their parts read by positional reads (``dalistream.io.local.FileRange``):
a whole shard its bytes to the end of the file; a part exactly the bytes of the range, seekable within it, then an end-of-archive marker, only after all of them
came (a cut shard stays a truncated tar); its bytes as views of the file's mapping (no copy),
never past the file's end as it is now, and mapped only as long as views of them are held; gzip content under a ``.tar`` name read through the
decompressor, a part of it a tar too; the parts of one file open at once share its descriptor
(a worker's interleaved columns), a file replaced under its path is opened anew; and the read
budget a worker's columns share (``shared_budget``)."""

import gc
import gzip
import os

import pytest

from dalistream.errors import ShardFormatError, SourceError
from dalistream.io import openfiles
from dalistream.io.local import END_OF_ARCHIVE, FileRange
from dalistream.io.options import MIN_SHARED_CHUNK, remote_options, shared_budget
from dalistream.io.streams import open_shard
from dalistream.tar import iter_samples
from dalistream.manifest import build_manifest

from helpers import key_shards, maps_file, passed_over_shard


def read_all(stream, size=1000):
    out = bytearray()
    buf = bytearray(size)
    while True:
        n = stream.readinto(buf)
        if not n:
            return bytes(out)
        out += buf[:n]


def test_a_whole_local_shard_is_its_bytes_read_in_place(tmp_path):
    """Without an end, a local shard is read by positional reads to the end of the file, with no
    marker of ours (it has its own) and no buffer of its own; its size known, for the tar
    reader's checks."""
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    whole = open_shard(path)
    assert isinstance(whole, FileRange) and whole.file_size == len(data) and not hasattr(whole, "peek")
    assert read_all(whole, 777) == data
    rest = open_shard(path, 1536)
    assert rest.tell() == 1536 and read_all(rest) == data[1536:]
    assert [s["__key__"] for s in iter_samples(open_shard(path), path)] == [f"s000/{i:05d}" for i in range(9)]


def test_a_local_part_is_its_bytes_then_the_marker(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    part = open_shard(path, 1536, None, 4096)
    assert isinstance(part, FileRange) and part.tell() == 1536 and part.remaining == 2560
    assert read_all(part, 700) == data[1536:4096] + END_OF_ARCHIVE
    part = open_shard(path, 1536, None, 4096)
    assert read_all(part, 333) == data[1536:4096] + END_OF_ARCHIVE
    part.seek(2000)
    assert part.tell() == 2000 and part.seek(99999) == 4096


def test_a_part_cut_short_has_no_marker_and_reads_as_truncated(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    offsets = build_manifest([path], offsets=True)[0].offsets
    end = offsets[6]
    with open(path, "r+b") as f:
        f.truncate(offsets[4] + 700)  # the shard lost its end after it was indexed
    part = open_shard(path, offsets[2], None, end)
    with pytest.raises(ShardFormatError):
        list(iter_samples(part, path, first_index=2))


def test_a_part_whose_last_bytes_are_passed_over_still_ends_with_the_marker(tmp_path):
    """The part's end reached by a seek (its last member not wanted) is reached as by a read:
    the marker follows (a header walk of a part with an end found no marker there and called
    the shard truncated); a seek that stays short of it, or a file cut before it, gives none."""
    path = str(tmp_path / "p.tar")
    offsets = passed_over_shard(path)
    n = len(offsets)
    for chunk in (512, 1024, 4096, 1 << 16):
        for i in range(n):
            for j in range(i + 1, n + 1):
                end = offsets[j] if j < n else None
                with open_shard(path, offsets[i], None, end) as f:
                    keys = [s["__key__"] for s in iter_samples(f, path, want_ext=lambda e: e == "cls",
                                                               first_index=i, chunk=chunk)]
                assert keys == [f"p/{k:03d}" for k in range(i, j)], (chunk, i, j)
    part = open_shard(path, offsets[2], None, offsets[4])
    part.seek(offsets[4] - 1)
    assert part.read(10) == open(path, "rb").read()[offsets[4] - 1:offsets[4]]  # (one byte read: then the marker)
    assert part.read() == END_OF_ARCHIVE
    part = open_shard(path, offsets[2], None, offsets[4])
    assert part.seek(offsets[4]) == offsets[4] and part.read() == END_OF_ARCHIVE and part.read() == b""
    assert part.seek(0, 1) == offsets[4] and part.read() == b""  # (no second marker from staying there)
    with open(path, "r+b") as f:
        f.truncate(offsets[4] - 700)  # (the file cut inside the part's last member)
    part = open_shard(path, offsets[2], None, offsets[4])
    assert part.seek(offsets[4]) == offsets[4] and part.read() == b""
    with pytest.raises(ShardFormatError):
        with open_shard(path, offsets[2], None, offsets[4]) as f:
            list(iter_samples(f, path, want_ext=lambda e: e == "cls", first_index=2, chunk=1024))


def test_gzip_content_under_a_tar_name_is_decompressed(tmp_path):
    path = key_shards(str(tmp_path), [5])[0]
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(gzip.compress(data))
    part = open_shard(path, 1024, None, 2048)
    assert not isinstance(part, FileRange)
    assert read_all(part) == data[1024:2048] + END_OF_ARCHIVE


def open_descriptors(path):
    """This process's descriptors open on ``path``."""
    fds = os.listdir("/proc/self/fd")
    out = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == os.path.abspath(path):
                out.append(fd)
        except OSError:
            pass
    return out


def test_the_parts_of_a_file_open_at_once_share_one_descriptor(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    parts = [open_shard(path, a, None, b) for a, b in ((512, 1536), (1536, 4096), (0, 1024))]
    assert len(open_descriptors(path)) == 1
    assert read_all(parts[1], 500) == data[1536:4096] + END_OF_ARCHIVE  # each still its own bytes
    parts[1].close()
    parts[1].close()  # (closing twice hands it back once)
    assert read_all(parts[0]) == data[512:1536] + END_OF_ARCHIVE and len(open_descriptors(path)) == 1
    parts[0].close()
    del parts[2]  # (dropped unclosed: closed as it goes)
    assert open_descriptors(path) == []
    again = open_shard(path, 0, None, 512)
    assert read_all(again) == data[:512] + END_OF_ARCHIVE and len(open_descriptors(path)) == 1
    again.close()
    assert open_descriptors(path) == []


def test_a_file_replaced_under_its_path_is_opened_anew(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    old = open(path, "rb").read()
    held = open_shard(path, 0, None, 1024)  # a part of the old file, still open
    new = bytes(reversed(old))
    with open(path + ".tmp", "wb") as f:
        f.write(new)
    os.replace(path + ".tmp", path)
    fresh = open_shard(path, 0, None, 1024)
    assert read_all(fresh) == new[:1024] + END_OF_ARCHIVE
    assert read_all(held) == old[:1024] + END_OF_ARCHIVE  # (what was open reads what it opened)
    held.close(), fresh.close()
    os.remove(path)
    with pytest.raises(SourceError) as e:
        open_shard(path, 0, None, 1024)
    assert e.value.reason == "missing"


def test_a_forked_child_reads_the_parts_it_opens_and_the_parent_keeps_its_own(tmp_path):
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    held = open_shard(path, 0, None, 1024)
    pid = os.fork()
    if pid == 0:  # the child: its own table; the parent's part closes here without touching the parent's
        ok = False
        try:
            part = open_shard(path, 1024, None, 2048)
            ok = read_all(part) == data[1024:2048] + END_OF_ARCHIVE
            part.close()
            held.close()
            ok = ok and open_descriptors(path) == []
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert read_all(held) == data[:1024] + END_OF_ARCHIVE
    held.close()
    assert open_descriptors(path) == []


def test_a_child_forked_while_the_table_is_locked_still_opens_parts(tmp_path):
    """Another thread of the parent holds the table's lock at the fork (a reader opening a part):
    the child has a lock of its own and does not wait for ever."""
    import signal

    from dalistream.io.openfiles import files_table

    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    with files_table().lock:
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                signal.alarm(20)  # (a deadlock ends the child, and the test fails, instead of hanging)
                part = open_shard(path, 0, None, 512)
                ok = read_all(part) == data[:512] + END_OF_ARCHIVE
                part.close()
            finally:
                os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_columns_share_one_streams_budget():
    """The columns' read-ahead adds up to the worker's (no floor that grows with the columns), each
    column's parts half its share (its next part fetched while it reads one), the requests in
    flight the worker's (not divided)."""
    one = remote_options({})
    for share in (2, 32, 128, 4096):
        shared = remote_options(shared_budget({}, share))
        assert shared.read_ahead_bytes * share <= max(one.read_ahead_bytes, 2048 * share)
        assert shared.part_bytes <= max(1024, shared.read_ahead_bytes // 2) and shared.part_bytes <= one.part_bytes
        assert shared.parts_in_flight == one.parts_in_flight
        assert shared.chunk_bytes == min(shared.read_ahead_bytes, max(MIN_SHARED_CHUNK, one.chunk_bytes // share))
    assert shared_budget({"endpoint_url": "http://x"}, 1) == {"endpoint_url": "http://x"}
    assert remote_options(shared_budget({"parts_in_flight": 16, "read_ahead_bytes": 128 << 20}, 4)).parts_in_flight == 16
    assert remote_options(shared_budget({"read_ahead_bytes": 128 << 20}, 4)).part_bytes == 8 << 20


def test_a_part_closed_while_the_table_is_locked_does_not_wait(tmp_path):
    """The garbage collector may finalize a dropped reader's part inside ``open_range``, in the
    same thread, while the table of open files is locked: the part's release is counted once the
    lock is free (it used to wait for the lock for ever), and the file closes with its last part."""
    import threading

    from dalistream.io.openfiles import files_table

    path = key_shards(str(tmp_path), [9])[0]
    seen = {}
    table = files_table()

    def scenario():
        part = open_shard(path, 0, None, 1024)
        shared_file = table.files[path]
        with table.lock:
            part.close()  # as a finalizer run by the collector inside open_range would
            seen["open while locked"] = path in table.files
        other = open_shard(path, 1024, None, 2048)  # counts the release waiting: one part reads the file
        seen["same file"] = table.files[path] is shared_file and len(open_descriptors(path)) == 1
        other.close()
        seen["closed with its last part"] = path not in table.files and open_descriptors(path) == []

    t = threading.Thread(target=scenario, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "closing a part while the table was locked waited for the lock"
    assert seen == {"open while locked": True, "same file": True, "closed with its last part": True}


def mappings_of(path):
    """This process's mappings of ``path`` (``/proc/self/maps``)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(real)]


def test_a_local_part_s_bytes_come_as_views_of_its_mapping_then_the_marker(tmp_path):
    """``view(n)``: the range's next bytes mapped, no copy (read-only, the mapping their
    ``obj``), the position moved on; fewer at the range's end, then the marker by ``readinto``."""
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    part = open_shard(path, 1536, None, 4096)
    first = part.view(1000)
    assert bytes(first) == data[1536:2536] and first.readonly and maps_file(first, path)
    assert part.tell() == 2536
    rest = part.view(5000)  # (the range ends first)
    assert bytes(rest) == data[2536:4096] and rest.obj is first.obj and part.remaining == 0
    assert read_all(part) == END_OF_ARCHIVE and len(part.view(10)) == 0
    whole = open_shard(path)
    assert bytes(whole.view(len(data) + 99)) == data and read_all(whole) == b""  # (a whole shard: its own marker)
    part.close(), whole.close()


def test_a_mapping_follows_the_file_as_it_is_now(tmp_path):
    """A shard rewritten in place (its inode kept) while a part of it is open: views never reach
    past the file's end as it is now (touching a mapped page past it would kill the process), and
    the bytes it gained are mapped anew; views given out before keep their bytes' pages mapped."""
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    part = open_shard(path, 0, None)
    early = part.view(512)
    with open(path, "r+b") as f:
        f.truncate(3000)
    assert bytes(part.view(10 ** 6)) == data[512:3000] and part.tell() == 3000
    with open(path, "ab") as f:
        f.write(b"x" * 1000)
    assert bytes(part.view(10 ** 6)) == b"x" * 1000
    assert bytes(early) == data[:512]
    part.close()


def test_a_mapping_gives_out_so_much_then_a_new_one_is_made_and_none_outlives_its_views(tmp_path, monkeypatch):
    """What stays mapped is what the readers hold: a file's mapping gives out ``MAP_BYTES`` of
    views at most, then a new one serves; a mapping goes with its last view, once the file's
    parts are closed."""
    monkeypatch.setattr(openfiles, "MAP_BYTES", 2048)
    path = key_shards(str(tmp_path), [9])[0]
    data = open(path, "rb").read()
    part = open_shard(path, 0, None)
    views = [part.view(1024) for _ in range(4)]
    assert [bytes(v) for v in views] == [data[i:i + 1024] for i in range(0, 4096, 1024)]
    assert views[0].obj is views[1].obj and views[2].obj is views[3].obj and views[1].obj is not views[2].obj
    assert len(mappings_of(path)) >= 1
    part.close()
    kept = views[3]
    del views
    gc.collect()
    assert len(mappings_of(path)) == 1 and bytes(kept) == data[3072:4096]  # (the mapping of the view kept)
    del kept
    gc.collect()
    assert mappings_of(path) == []


def test_an_empty_file_gives_empty_views(tmp_path):
    path = str(tmp_path / "empty.tar")
    open(path, "wb").close()
    part = open_shard(path, 0, None)
    assert part.view(100) is not None and len(part.view(100)) == 0 and part.tell() == 0
    part.close()


def test_a_process_keeps_at_most_its_budget_of_files_open_and_reopens_what_it_closed(tmp_path, monkeypatch):
    """Parts of more files than the table's budget, read in turn: never more descriptors open than
    the budget (the least recently read closed), each part reading its own bytes; a file closed
    this way and replaced meanwhile is an error naming it (``changed``), never the new file's
    bytes; one removed, too. Closing the parts closes everything."""
    from dalistream.io.openfiles import FileTable, files_table

    monkeypatch.setattr(openfiles, "_table", FileTable(2))
    paths = key_shards(str(tmp_path), [9, 9, 9, 9, 9], prefix="t")
    data = [open(p, "rb").read() for p in paths]
    parts = [open_shard(p, 0, None, 4096) for p in paths]

    def held():
        return sum(len(open_descriptors(p)) for p in paths)

    got = [b"" for _ in paths]
    for _ in range(4):  # each part read 1 kB at a time, in turn
        for k, part in enumerate(parts):
            got[k] += part.read(1024)
            assert held() <= 2
    assert got == [d[:4096] for d in data] and files_table().peak == 2
    assert len(parts[0].view(10)) == 0 and held() <= 2  # (past its range: nothing opened for it)
    again = [open_shard(p, 0, None, 2048) for p in paths[:3]]  # (the files the parts read: none opened)
    for part in parts[3:]:
        part.seek(0), part.read(10)  # (read last: 0, 1 and 2 closed)
    assert held() == 2 and not open_descriptors(paths[0])
    os.replace(paths[3], paths[0])  # (0's path names another file now)
    with pytest.raises(SourceError) as e:
        again[0].read(10)
    assert e.value.reason == "changed" and e.value.url == paths[0]
    assert again[2].read(10) == data[2][:10]  # (2 opened again: the same file)
    os.remove(paths[1])
    with pytest.raises(SourceError) as e:
        again[1].read(10)
    assert e.value.reason == "changed" and e.value.url == paths[1]
    for part in parts + again:
        part.close()
    assert files_table().files == {} and not files_table().open
    assert all(open_descriptors(p) == [] for p in paths)
