"""Parquet bar tables as sources (columns as :mod:`.table` finds them), read a row group at a time, a URL
through fsspec; a null symbol is dropped (``missing symbol``), a null timestamp is out of range.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import SourceError, one_line
from ...format.paths import is_url
from .files import open_input, url_fs
from .table import SYMBOL_NAMES, TS_NAMES, TabularSource

__all__ = ["SYMBOL_NAMES", "TS_NAMES", "ParquetSource"]


class ParquetSource(TabularSource):
    """A Parquet file of bars; see :mod:`.table` for how columns are found."""

    kind = "parquet"

    def _schema(self) -> pa.Schema:
        """The file's Arrow schema from its footer; a one-line SourceError for a file that is not Parquet."""
        path, storage_options = self.path, self.storage_options
        try:
            pf = self._open()
        except (pa.ArrowException, OSError) as exc:
            msg = one_line(exc)
            if "magic" in msg.lower():
                with open_input(path, storage_options) as fh:
                    truncated = fh.read(4) == b"PAR1"
                if truncated:
                    raise SourceError(path, "truncated Parquet file (no footer)") from None
                raise SourceError(path, "not a Parquet file (bad magic bytes)") from None
            raise SourceError(path, f"corrupt Parquet metadata ({msg})") from None
        schema = pf.schema_arrow
        pf.close()
        return schema

    def _open(self) -> pq.ParquetFile:
        """The file's Parquet reader: Arrow's own file locally, an fsspec file for a URL (closed with it)."""
        if not is_url(self.path):
            # pre_buffer would hold every row group in memory at once: read them one at a time
            return pq.ParquetFile(self.path, pre_buffer=False)
        fs, path = url_fs(self.path, self.storage_options)
        return pq.ParquetFile(path, filesystem=fs, pre_buffer=False)

    def _batches(self, max_rows: int, wanted: list[str]) -> Iterator[pa.RecordBatch]:
        done = 0
        try:
            with self._open() as pf:
                for batch in pf.iter_batches(batch_size=max_rows, columns=wanted):
                    done += batch.num_rows
                    yield batch
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(self.path, f"corrupt Parquet data after {done} rows ({one_line(exc)})") from None
