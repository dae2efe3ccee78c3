"""The on-disk contract: layout and codecs, manifest, shard decoder, ``Cache`` and its writer (numpy + zarr only)."""

__all__: list[str] = []
