"""The tuning constants of every wing: values that trade speed or memory, each with what it trades, the figure that
justifies it and the tool that measures it, so a value changes only with a new figure ("no figure recorded": chosen,
never measured; figures from the 2-core development machine, runs in docs/performance.md and docs/notes/scale-notes.md).
Formats, semantic limits and documented defaults stay where they mean something (``FORMAT_VERSION``, ``MAX_HISTORY``,
``GRAIN``, ``memory_budget="auto"``'s fractions). A leaf, importing nothing of the package; a module imports a constant
by name (``from ..tuning import RUN_BYTES``), so a test patches the name where it is used (``reader.FAST_READ``).
"""

from __future__ import annotations

import os

__all__ = [
    "BATCH_BYTES",
    "BATCH_TABLES",
    "CSV_BLOCK",
    "DBN_BLOCK_ROWS",
    "FAST_READ",
    "FILE_BATCH",
    "FILE_THREADS",
    "GROUP_BLOCKS",
    "HUGE_MAP",
    "KEEP_BUFFER",
    "LAYOUT_WINDOWS",
    "LOCKS",
    "LRU_BLOCKS",
    "MAX_DECODERS",
    "MIN_CHUNK",
    "OPEN_THREADS",
    "PLAIN_BYTES",
    "PLAIN_FILES",
    "RUNS_AHEAD",
    "RUN_BYTES",
    "SLOTS",
    "SMALL_ARENA",
    "SMALL_BLOCK",
    "SPILL_ROWS",
    "SURE_TO_FIT",
    "TASK_BATCH",
    "TIME_CHUNKS",
    "WAIT",
    "ZSTD_STEP",
]

# ---- format/ ----------------------------------------------------------------------------------

KEEP_BUFFER = 32 << 20  # decode.py: a thread keeps its read buffer up to this size (memory for page faults)
# first reads of a process 1.0-1.8 ms into a reused 8 MiB buffer, 7.4 ms into a fresh one (tool not recorded;
# `tools/bench.py first` times that decode phase); no figure recorded for 32 MiB

FILE_THREADS = min(4, os.cpu_count() or 1)  # objects.py: threads writing a local cache's many small files
FILE_BATCH = 1000  # objects.py: objects a thread of ``put_many`` writes at least (threads for kernel time)
# both: 2 threads write 2,000 symbols' documents in 0.19-0.23 s, against 0.29-0.32 s for one (paired runs;
# `tools/bench.py symbols` builds them); no figure recorded for the cap of 4 or for 1000

LOCKS = 256  # local_cache.py: lock files; two misses of different objects wait for each other 1 time in 256
# no figure recorded (the collision rate is arithmetic; the files are a few KB)

TIME_CHUNKS = 16  # bar_times.py: time shards kept (LRU), twice the 2 x mix = 8 shards a batch draws from
# no figure recorded (memory bound held by tests/test_read_options.py)

# ---- read/ ------------------------------------------------------------------------------------

MAX_DECODERS = 8  # options.py: default decoder threads per reader, at most: more find no blocks to decode
# no figure recorded (mix=4, prefetch=2: about 6 blocks in flight; `tools/bench.py cores` measures 1 and 2 cores)

SURE_TO_FIT = 256 << 20  # settings.py: batches up to this size skip the free-memory check; no figure recorded

RUN_BYTES = 4 << 20  # reader.py, serve.py: in-process, consecutive batches copied together up to this size
# an epoch of 2,000 x 300: runs of 1 MiB 0.43 -> 0.61 s, 16 MiB no gain (paired; `tools/bench.py symbols`)

RUNS_AHEAD = 2  # reader.py, serve.py: gathered runs queued ahead of an in-process consumer (memory for overlap)
# no figure recorded for 2 (a worker's 1, in serve.py: 60-90 MiB less tree RSS at F=256, the same rate)

SMALL_BLOCK = 256 << 10  # reader.py: decoded bytes of a block the gather thread may read itself, when reads are fast
FAST_READ = 1e-3  # reader.py: seconds a small block's read must take (the fastest of late) for that
# both: 2,000 small shards handed to decoders 0.4-1.1 s an epoch, read on the gather thread 0.33 s; FAST_READ
# 0.1 ms: 0.54 -> 0.66 s cold, 0.41 -> 0.59 s warm (paired epochs; `tools/bench.py symbols` times one)

LAYOUT_WINDOWS = 1 << 16  # reader.py: windows of the pools laid out (and shuffled) together, ~270 small symbols
# 2,000 x 300: a shuffle 95-144 -> 31 us, an epoch 0.576 -> 0.474 s (paired; `tools/bench.py symbols`)

GROUP_BLOCKS = 64  # reader.py: small blocks read in one ``Sources.read_many`` call, at most
# groups of 16 or 256 instead: within the noise (0.387 / 0.443 / 0.404 s an epoch of 2,000 x 300, 6 rounds;
# `tools/bench.py symbols`); no figure recorded for 64 against other sizes

MIN_CHUNK = 8  # storage.py: windows per index_select call below which numpy.take is the faster copy; no figure recorded

SMALL_ARENA = 1 << 20  # storage.py: bytes of a pool's arena below which it comes from the heap, not a map
# 500 maps, unmaps and fresh pages an epoch fewer at 2,000 symbols; no timing recorded

HUGE_MAP = 4 << 20  # storage.py: maps from this size ask for huge pages (numpy's own threshold)
# gathers from 4 KiB pages 6-10% slower than from huge pages (resident epochs, `tools/bench.py loaders`)

SLOTS = 8  # ship.py, per worker: runs ahead (2), batches in flight (prefetch_factor 2), kept by the caller
# 5-6 used at F=256 with 2 workers, 15.7 MB each (`tools/bench.py loaders`)

WAIT = 0.02  # ship.py: seconds a worker waits for a free slot before it sends fresh tensors; no figure recorded

LRU_BLOCKS = 4  # dataset.py: decoded blocks a WindowDataset keeps (LRU)
# no figure recorded (memory bound held by tests/test_memory.py)

# ---- inspect/ ---------------------------------------------------------------------------------

OPEN_THREADS = 8  # views.py: object-store symbols open_symbols opens at once (a few reads each); no figure recorded

# ---- ingest/ ----------------------------------------------------------------------------------

PLAIN_BYTES = 32 << 20  # merge.py: bytes of rows a stretch of plain symbols holds at once
PLAIN_FILES = 32  # merge.py: spill files a stretch of plain symbols reads at once
# 665K x 256 from Parquet: peak RSS 984 -> 578 MB with stretches bounded so (commit 02d9e21; `tools/bench.py
# build`); no figure recorded for 32 files against other counts

BATCH_BYTES = 4 << 20  # merge.py: bytes of small clusters written as one record batch of a cluster file
BATCH_TABLES = 16  # merge.py: clusters written as one record batch at the most
# 10x the days: 243 -> 78 MiB of spill pages mapped (28451bf; `tools/bench.py build`); no figure recorded for 16 tables

SPILL_ROWS = 1 << 16  # scan.py: rows of a piece sorted and written to its spill file at a time
# batching spills removed 1,566 file openings at 2,000 symbols (commit f34c262); no figure for the value

TASK_BATCH = 256  # tasks.py: tasks per dask graph (bounds the scheduler state at 10,000s of files); no figure recorded

ZSTD_STEP = 8 << 20  # sources/dbn.py: bytes asked of a DBN file's zstd stream at once
DBN_BLOCK_ROWS = 1 << 16  # sources/dbn.py: records decoded at once (to fit the CPU caches)
CSV_BLOCK = 4 << 20  # sources/csv.py: bytes per CSV read block: bounds a piece's memory; no figure recorded for these 3
