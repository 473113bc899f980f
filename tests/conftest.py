import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py

from helpers import free_port  # noqa: E402


# Tests that take 5 s or more on a loaded 2-core machine, in modules whose other tests are quick: marked
# `slow` here, so that the quick first run (`python -m pytest -q -m "not slow"`, README) stays minutes
# while still covering every stage. A name here that its module no longer defines stops the run.
SLOW = {
    "io/test_parts.py": ("test_a_workers_streams_share_one_fetcher_and_its_budget",),
    "io/test_stall.py": ("test_a_silent_server_is_reported_then_given_up_on",),
    "loader/test_remote_interleave.py": ("test_a_workers_columns_are_fetched_together_within_its_budget",
                                         "test_parts_in_flight_given_bounds_a_workers_columns"),
    "plan/test_affinity.py": ("test_elastic_resume_onto_other_node_counts_delivers_the_epoch",),
    "plan/test_buckets.py": ("test_large_layouts",),
    "plan/test_equal_batches.py": ("test_after_an_elastic_resume_too",
                                   "test_every_rank_runs_the_same_steps_and_no_batch_is_only_padding_where_a_sample_could_be"),
    "plan/test_mix.py": ("test_1024_ranks", "test_default_epoch_of_1024_ranks_is_fast"),
    "plan/test_mix_interleave.py": ("test_plan_shuffle_quality_of_a_two_source_mix_meets_the_targets",),
    "plan/test_quality.py": ("test_batches_hold_every_owned_sample_once",),
    "plan/test_resume.py": ("test_large_layouts", "test_segments_deliver_the_epoch"),
    "plan/test_spans.py": ("test_spans_tile_the_epoch_once_and_keep_the_promises",),
    "stores/test_startup.py": ("test_a_prefix_of_50000_shards_opens_with_a_few_requests",),
    "stores/test_stores.py": ("test_write_shards_and_index_a_manifest_there",),
    "tar/test_runs.py": ("test_runs_deliver_what_the_header_walk_reads",),
    "test_cli.py": ("test_an_error_prints_once_and_its_traceback_only_at_debug", "test_keys_stats_add_up_per_rank",
                    "test_keys_stats_add_up_to_the_keys_printed", "test_keys_with_buckets_prints_each_batch_s_bucket"),
    "test_save_load.py": ("test_the_loader",),
    "test_torchrun_recipe.py": ("test_each_rank_puts_model_nccl_and_batches_on_its_local_gpu",
                                "test_the_fake_world_catches_the_old_outline"),
    "worker/test_rows.py": ("test_blocks_and_single_samples_give_the_same_batches_skips_and_errors",),
}
TESTS = os.path.dirname(os.path.abspath(__file__))


def slow_names(module) -> tuple:
    """The names :data:`SLOW` marks in ``module``; one the module does not define is an error."""
    where = os.path.relpath(str(module.__file__), TESTS).replace(os.sep, "/")
    names = SLOW.get(where, ())
    gone = [name for name in names if not callable(getattr(module, name, None))]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py marks tests/{where}::{gone} slow, which it no longer defines")
    return names


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """Marks :data:`SLOW` slow. GPU tests run last: a GPU pipeline initializes CUDA in this process,
    after which DALI cannot fork workers, and many tests fork theirs (start_method='fork', or 'auto'
    on the CPU)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(item, "originalname", item.name) in slow_names(module):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("gpu") is not None)  # stable: order kept otherwise


@pytest.fixture(scope="session", autouse=True)
def cache_inside_the_run(tmp_path_factory):
    """Scan counts and parsed manifests are cached in a folder of this test run, never in the
    user's ``~/.cache/dalistream`` (tests read nothing outside the repository and their own files)."""
    saved = os.environ.get("DALISTREAM_CACHE")
    os.environ["DALISTREAM_CACHE"] = str(tmp_path_factory.mktemp("dalistream-cache"))
    yield
    if saved is None:
        os.environ.pop("DALISTREAM_CACHE", None)
    else:
        os.environ["DALISTREAM_CACHE"] = saved


# -- a real S3 server (moto) for the modules that read s3:// -------------------------------------

@pytest.fixture(scope="module")
def aws_env():
    """Test credentials for boto3's normal chain (also inherited by DALI's workers and by child
    processes); any AWS_* settings of the machine are hidden for the module's duration."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def moto_endpoint(aws_env):
    """A moto S3 server in this process (a thread) on a free port of 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
