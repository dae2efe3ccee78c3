"""Views of a cache for people and tools: the shard table, ``to_xarray``, ``info`` and ``verify``."""

__all__: list[str] = []
