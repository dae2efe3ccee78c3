"""Views of a cache for people and tools: the shard table, ``to_xarray``, ``info`` and ``verify``.

The name shadows nothing: every import of it is ``shardcache.inspect``. Running a file of this
folder as a script (``python shardcache/inspect/x.py``) would put the folder first on
``sys.path`` and hide the standard library's ``inspect``; nothing does that."""

__all__: list[str] = []
