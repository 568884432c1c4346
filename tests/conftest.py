"""Shared fixtures for the CPU test suite.

Every test runs with cwd = its own tmp_path (nothing may write ./tune.db into the repository),
without TUNESVC_DB / TUNESVC_BUNDLE in the environment, with TUNESVC_RESIDENT=0 (a `tune sweep`
it runs starts no resident process; tests/test_resident.py turns it on for its own), and with a
fresh process-wide runtime.
Triton kernels run in the CPU interpreter (tunesvc.kernels sets TRITON_INTERPRET=1 when no GPU
is present; it is imported here first because the flag only works if it is set before triton is
imported), so every shape here is tiny.
"""

from __future__ import annotations

import os

import pytest
import torch

import tunesvc
import tunesvc.kernels
import tunesvc.serving.runtime

# the CLI's tables are drawn for an 80-column terminal, as in pytest-xdist's workers (which set
# COLUMNS=80): a test run without -n sees the same output
os.environ.setdefault("COLUMNS", "80")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNESVC_DB", raising=False)
    monkeypatch.delenv("TUNESVC_BUNDLE", raising=False)
    monkeypatch.setenv("TUNESVC_RESIDENT", "0")
    monkeypatch.setattr(tunesvc.serving.runtime, "_default", None)
    yield
    tunesvc.serving.runtime._default = None


@pytest.fixture
def tmp_db(tmp_path) -> str:
    """Path of a SQLite file that does not exist yet, in this test's tmp_path."""
    return str(tmp_path / "test.db")


@pytest.fixture
def template():
    return tunesvc.get_template("matmul")


@pytest.fixture(scope="session")
def device():
    return tunesvc.current_device()
