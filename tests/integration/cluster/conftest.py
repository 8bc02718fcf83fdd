"""One real etcd member for each test module of the cluster plane, and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from aenv.cluster.etcd import Etcd
from tests.support.etcd import EtcdCluster, etcd_cluster


@pytest.fixture(scope="module")
def one() -> Iterator[EtcdCluster]:
    with etcd_cluster(1) as c:
        yield c


@pytest.fixture
async def etcd(one: EtcdCluster) -> AsyncIterator[Etcd]:
    client = Etcd(one.endpoints)
    yield client
    await client.aclose()
