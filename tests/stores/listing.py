"""What the Redis and Redis Cluster stores' tests share: a listing longer than one page of the server's scan."""

from __future__ import annotations

import io

from cachelib.stores import Store


def lists_past_one_page(store: Store) -> None:
    """1,203 objects (more than a SCAN page or a cluster node's share) listed whole, in key order."""
    keys = [f"k/{i:05d}" for i in range(1203)]
    for key in keys:
        store.put(key, io.BytesIO(b""), 0)
    assert [i.key for i in store.list("k/")] == keys
