"""CSV bar tables (``*.csv``, ``*.csv.gz``: vendors' exports) as sources, read by ``pyarrow.csv``.

Columns are found, typed and cleaned exactly as for Parquet (:mod:`.table`); their types
are what ``pyarrow.csv`` infers from the first block (ISO-8601 times become timestamps,
whole numbers int64), except that value columns are then read as float64, so a fraction
after the first block is no error (integers above 2**53 are still refused). The file is
read block by block (``open_csv``), never whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pcsv

from ...errors import SourceError, one_line
from .files import open_input
from .table import TabularSource

__all__ = ["CsvSource"]

_BLOCK = 4 << 20  # bytes per block: bounds a piece's memory


class CsvSource(TabularSource):
    """A CSV file of bars, one row per bar after a header line."""

    kind = "csv"

    def _schema(self) -> pa.Schema:
        """The columns and types ``pyarrow.csv`` infers from the header and the first block."""
        with self._reader() as reader:
            return reader.schema

    def _reader(self, columns: list[str] | None = None) -> pcsv.CSVStreamingReader:
        """A block reader; with ``columns``, the value columns are read as float64 whatever the first
        block suggested (a column of whole numbers may hold a fraction further down)."""
        raw = open_input(self.path, self.storage_options)
        stream = pa.input_stream(
            pa.PythonFile(raw, mode="r"), compression="gzip" if self.path.lower().endswith(".gz") else None
        )
        types = {n: pa.float64() for n in self._source_name.values()} if columns else None
        convert = pcsv.ConvertOptions(include_columns=columns, column_types=types, timestamp_parsers=[pcsv.ISO8601])
        try:
            return pcsv.open_csv(stream, read_options=pcsv.ReadOptions(block_size=_BLOCK), convert_options=convert)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            stream.close()
            raise SourceError(self.path, f"not a readable CSV file ({one_line(exc)})") from None

    def _batches(self, max_rows: int, wanted: list[str]) -> Iterator[pa.RecordBatch]:
        done = 0
        try:
            with self._reader(wanted) as reader:
                for batch in reader:
                    for start in range(0, batch.num_rows, max_rows):
                        part = batch.slice(start, max_rows)
                        done += part.num_rows
                        yield part
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(self.path, f"bad CSV data after {done} rows ({one_line(exc)})") from None
