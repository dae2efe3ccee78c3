"""Views of a cache for people and tools: the shard table, ``to_xarray``, ``info`` and ``verify``.

The name shadows nothing: it is always imported as ``shardcache.inspect`` (never run a file of it as a script)."""

__all__: list[str] = []
