"""Writing caches: sources (DBN, Parquet), features, splits, the build stages, appends, staging and dask tasks."""

__all__: list[str] = []
