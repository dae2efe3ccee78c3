"""CSV bar tables (vendors' exports) as sources, read block by block by ``pyarrow.csv`` (``open_csv``).

Columns are found and cleaned as for Parquet (:mod:`.table`), typed from the first block, value columns read
as float64 (a later fraction is no error). The delimiter is ``csv_delimiter`` or sniffed from the header.
Thousands separators and decimal commas are read once the first block shows the decimal mark (``"1,100"``
alone is refused); gzip, zstd and bz2 are told by their magic bytes; ``#`` lines before the header are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ...errors import SourceError, one_line
from ...format.build_options import DELIMITERS, parse_delimiter
from ...tuning import CSV_BLOCK
from .base import DBN_MAGIC, ZSTD_MAGIC
from .files import open_input
from .table import TabularSource

__all__ = ["CsvSource", "sniff_delimiter"]

GZIP_MAGIC = b"\x1f\x8b"
_COMPRESSED = {GZIP_MAGIC: "gzip", ZSTD_MAGIC: "zstd", b"BZh": "bz2"}  # magic bytes -> pyarrow codec
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_SAMPLE = 4096  # distinct texts of a column looked at to tell how its numbers are written

# how a number may be written in a text column (the first block's texts tell which marks a file uses)
_PLAIN = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # 1100, 1100.25, 1e3
_COMMA_GROUPS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")  # 1,100 or 1,100.25
_DOT_GROUPS = re.compile(r"[+-]?\d{1,3}(\.\d{3})+(,\d*)?")  # 1.100 or 1.100,25
_COMMA_DECIMAL = re.compile(r"[+-]?\d*,\d+")  # 1100,25 or ,5
_NOT_A_NUMBER = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)


def sniff_delimiter(header: str) -> str:
    """A CSV header's delimiter: of comma, semicolon, tab and pipe the commonest outside quotes (a comma on a tie)."""
    counts = dict.fromkeys(DELIMITERS.values(), 0)
    quoted = False
    for ch in header:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in counts:
            counts[ch] += 1
    return max(counts, key=lambda d: counts[d])


def _parse_error(exc: BaseException) -> str:
    """``pyarrow.csv``'s error in one line, saying so when the bad row is a ``#`` comment line past the header."""
    msg = one_line(exc)
    return msg + ("; a '#' comment line past the header: remove it" if re.search(r"columns, got 1: *#", msg) else "")


def _marks(text: str) -> tuple[set[str], bool] | None:
    """What one text says about the decimal mark: the marks it proves (``.``/``,``) and whether it is
    ambiguous (``1,100``: thousands or a decimal comma); None when it is not a number."""
    t = text.strip()
    if _NOT_A_NUMBER.fullmatch(t):
        return set(), False
    if _COMMA_GROUPS.fullmatch(t):
        return ({"."}, False) if "." in t else (set(), True)
    if _DOT_GROUPS.fullmatch(t):
        return ({","}, False) if "," in t else (set(), False)  # 1.100 alone reads as 1.1, as pyarrow reads it
    if _COMMA_DECIMAL.fullmatch(t):
        return {","}, False
    if _PLAIN.fullmatch(t):
        return ({"."} if "." in t else set()), False
    return None


class CsvSource(TabularSource):
    """A CSV file of bars, one row per bar after a header line."""

    kind = "csv"

    def __init__(self, path: str, *, csv_delimiter: str | None = None, **tabular: Any) -> None:
        self._delimiter = parse_delimiter(csv_delimiter)
        self._compression: str | None = None  # pyarrow codec told by the file's magic bytes
        self._skip = 0  # leading comment lines
        self._names: list[str] | None = None  # the header's names, blanks dropped (None: as pyarrow reads them)
        self._decimal = "."  # the file's decimal mark; the other of "." and "," separates thousands
        self._number_text: set[str] = set()  # columns read as text and turned into numbers here
        super().__init__(path, **tabular)

    def _stream(self) -> pa.NativeFile:
        raw = open_input(self.path, self.storage_options)
        return pa.input_stream(pa.PythonFile(raw, mode="r"), compression=self._compression)

    def _schema(self) -> pa.Schema:
        """The columns and types ``pyarrow.csv`` infers, those of numbers written with separators float64."""
        with open_input(self.path, self.storage_options) as fh:
            magic = fh.read(4)
        self._compression = next((c for m, c in _COMPRESSED.items() if magic.startswith(m)), None)
        try:
            with self._stream() as stream:
                head = stream.read(1 << 16)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(self.path, f"not a readable CSV file ({_parse_error(exc)})") from None
        if head.startswith(DBN_MAGIC):
            raise SourceError(self.path, "DBN data, not CSV text; name it .dbn or .dbn.zst")
        if head.startswith(_UTF16_BOMS):
            raise SourceError(self.path, "UTF-16 text; write it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)")
        lines = head.split(b"\n")
        while self._skip < len(lines) - 1 and lines[self._skip].lstrip(b"\xef\xbb\xbf").startswith(b"#"):
            self._skip += 1
        header = lines[self._skip].decode("utf-8", "replace")
        if self._delimiter is None:
            self._delimiter = sniff_delimiter(header)
        with self._reader() as reader:
            names = reader.schema.names
        if any(n != n.strip() for n in names):
            self._names = [n.strip() for n in names]
        with self._reader() as reader:
            schema = reader.schema
            try:
                first = reader.read_next_batch()
            except StopIteration:
                raise SourceError(
                    self.path, f"has a header ({', '.join(schema.names)}) and no rows: nothing to build"
                ) from None
            except (pa.ArrowException, OSError) as exc:
                raise SourceError(self.path, f"bad CSV data in its first block ({_parse_error(exc)})") from None
        self._find_number_text(schema, first)
        fields = [(n, pa.float64() if n in self._number_text else t) for n, t in zip(schema.names, schema.types)]
        if len(fields) > 1 and fields[-1][0] == "" and first.column(len(fields) - 1).null_count == first.num_rows:
            fields.pop()  # a comma ending every line: an empty, nameless last column
        return pa.schema(fields)

    def _find_number_text(self, schema: pa.Schema, first: pa.RecordBatch) -> None:
        """Which text columns hold numbers with separators, and the file's decimal mark; refuse a file
        whose marks contradict each other, or a column whose numbers could be read two ways."""
        proven: dict[str, tuple[str, str]] = {}  # mark -> (column, text) that proves it
        numbers, ambiguous = [], None
        for name, t in zip(schema.names, schema.types):
            if not pa.types.is_string(t):
                continue
            texts = pc.unique(first.column(name).drop_null()).slice(0, _SAMPLE).to_pylist()
            seen = [(x, _marks(x)) for x in texts if x.strip()]
            if not seen or any(m is None for _, m in seen):
                continue  # text, not numbers: not a value column (as in Parquet)
            numbers.append(name)
            for x, (marks, unsure) in seen:  # type: ignore[misc]
                for mark in marks:
                    proven.setdefault(mark, (name, x))
                if unsure and ambiguous is None:
                    ambiguous = (name, x)
        if len(proven) > 1:
            (c1, x1), (c2, x2) = proven[","], proven["."]
            raise SourceError(
                self.path,
                f"column '{c1}' writes {x1!r} with a decimal comma and column '{c2}' writes {x2!r} with a "
                "decimal point; write every number one way, or pick the columns with --columns",
            )
        if not proven and ambiguous is not None:
            name, x = ambiguous
            raise SourceError(
                self.path,
                f"column '{name}' holds {x!r}: a thousands separator or a decimal comma? the first rows do not "
                "tell; write the numbers without thousands separators, or leave the column out with --columns",
            )
        self._decimal = "," if "," in proven else "."
        self._number_text = set(numbers)
        if self._decimal == ",":  # what pyarrow read as 1.5 was a thousands separator: read it as text too
            self._number_text |= {n for n, t in zip(schema.names, schema.types) if pa.types.is_floating(t)}

    def _reader(self, columns: list[str] | None = None) -> pcsv.CSVStreamingReader:
        """A block reader; with ``columns``, the value columns are read as float64 whatever the first
        block suggested (a column of whole numbers may hold a fraction further down), and those of
        numbers written with separators as text."""
        stream = self._stream()
        types = None
        if columns:
            types = {n: pa.string() if n in self._number_text else pa.float64() for n in self._source_name.values()}
        convert = pcsv.ConvertOptions(include_columns=columns, column_types=types, timestamp_parsers=[pcsv.ISO8601])
        try:
            return pcsv.open_csv(
                stream,
                read_options=pcsv.ReadOptions(
                    block_size=CSV_BLOCK,
                    skip_rows=self._skip + (self._names is not None),
                    column_names=self._names,
                ),
                parse_options=pcsv.ParseOptions(delimiter=self._delimiter),
                convert_options=convert,
            )
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            stream.close()
            raise SourceError(self.path, f"not a readable CSV file ({_parse_error(exc)})") from None

    def _value(self, name: str, col: pa.Array) -> pa.Array:
        actual = self._source_name[name]
        if actual in self._number_text and (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = self._numbers(actual, col)
        return super()._value(name, col)

    def _numbers(self, name: str, col: pa.Array) -> pa.Array:
        """A text column of numbers written with the file's marks as float64 (blank texts as nulls)."""
        dec = self._decimal
        th = "." if dec == "," else ","
        t, d = re.escape(th), re.escape(dec)
        digits = rf"((\d{{1,3}}({t}\d{{3}})+|\d+)({d}\d*)?|{d}\d+)([eE][+-]?\d+)?"
        number = rf"^\s*[+-]?{digits}\s*$|^\s*(?i:[+-]?(nan|inf|infinity))\s*$"
        col = pc.if_else(pc.equal(pc.utf8_trim_whitespace(col), ""), pa.scalar(None, col.type), col)
        ok = pc.match_substring_regex(col, number).fill_null(True)
        if not pc.all(ok).as_py():
            bad = col.filter(pc.invert(ok))[0].as_py()
            raise SourceError(
                self.path,
                f"column '{name}' holds {bad!r}, not a number written as the file's others are "
                f"({'decimal comma' if dec == ',' else 'decimal point'}, {th!r} between thousands)",
            )
        text = pc.replace_substring(pc.utf8_trim_whitespace(col), th, "")
        return pc.replace_substring(text, dec, ".").cast(pa.float64())

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
            raise SourceError(self.path, f"bad CSV data after {done} rows ({_parse_error(exc)})") from None
