import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py

from helpers import free_port  # noqa: E402


# Tests that take 5 s or more on a loaded 2-core machine, in modules whose other tests are quick: marked
# `slow` here, so that the quick first run (`python -m pytest -q -m "not slow"`, README) stays minutes
# while still covering every stage. A name here that its module no longer defines stops the run.


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """GPU tests run last: a GPU pipeline initializes CUDA in this process, after which DALI cannot
    fork workers, and many tests fork theirs (start_method='fork', or 'auto' on the CPU)."""
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
