"""Fixtures for the cluster stand-ins: an API server with a kubeconfig the real client loads."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from gpuquota.sim.apiserver import ApiServer


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    with ApiServer() as api:  # the real server's defaults: bookmarks rare
        yield api


@pytest.fixture
def kube(apiserver: ApiServer) -> client.ApiClient:
    path = Path(tempfile.mkdtemp(dir="/tmp")) / "kubeconfig"
    apiserver.write_kubeconfig(path)
    return config.new_client_from_config(str(path))
