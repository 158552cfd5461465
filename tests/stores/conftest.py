"""The server fixtures, for running this folder on its own."""

from testsupport.servers import redis_cluster, redis_server, s3_server, store_url

__all__ = ["redis_cluster", "redis_server", "s3_server", "store_url"]
