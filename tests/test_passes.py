"""The stream's pass state and its shared-memory encoding (shardcache/read/passes.py), on its own:
pins, the passes after them, per-worker counts seen across real forked and spawned processes, the
loader's pass record, a private copy in a foreign process, and the plans' position checks."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from helpers import synthetic_bars

from shardcache.errors import OptionError, StateError
from shardcache.read.passes import MAX_HISTORY, MAX_WORKERS, Pass, PassState, Planner, SharedPass, check_history
from shardcache.read.plan import valid_ranges
from shardcache.read.settings import PlanSettings


def test_a_pin_and_the_passes_after_it():
    st = PassState()
    assert st.pinned == Pass(epoch=0) and st.fresh and st.upcoming() == Pass(epoch=0)
    history = tuple((w, 10 + w) for w in range(1, MAX_HISTORY + 1))  # the longest history there is
    st.pin(7, history)
    assert st.pinned == Pass(epoch=7, history=history) and st.fresh
    first = st.begin(rank=1, world=3)
    assert first == Pass(epoch=7, history=history, rank=1, world=3) and st.current == first and not st.fresh
    assert st.begin(rank=0, world=1) == Pass(epoch=8) and st.upcoming() == Pass(epoch=9)  # no history after the first
    assert st.generation == 2 and st.main_passes == 2
    with pytest.raises(StateError, match="a resume can chain 8 checkpoints of one epoch, not 9"):
        st.pin(0, ((1, 1),) * (MAX_HISTORY + 1))
    st.pin(2)
    assert st.current is None and st.main_passes == 0 and st.upcoming() == Pass(epoch=2)


def test_the_position_of_the_current_pass():
    st = PassState()
    st.pin(4, ((2, 5),))
    assert st.position(lambda p: 99) == (4, ((2, 5),))  # no pass yet: the pin itself
    st.begin(rank=0, world=3)
    for _ in range(6):
        st.count_delivered()
    assert st.position(lambda p: 10) == (4, ((2, 5), (3, 6)))
    st.delivered = 10
    assert st.position(lambda p: 10) == (5, ())  # every batch delivered: the next epoch, from its start


def _worker(state: PassState, worker: int, out) -> None:
    out.put(state.begin_worker(worker, rank=0, world=1))


def test_worker_passes_are_counted_in_shared_memory():
    """A worker process counts its own passes where the main process sees them (the epoch of the
    next pass follows the workers), each worker separately; a pin starts them again."""
    st = PassState()
    st.pin(3)
    ctx = mp.get_context("fork")  # as a DataLoader starts its workers (spawned ones: test_stream_workers)
    out = ctx.Queue()
    for worker in (0, 0, 1):
        p = ctx.Process(target=_worker, args=(st, worker, out))
        p.start()
        p.join()
        assert p.exitcode == 0
    got = sorted(out.get(timeout=30).epoch for _ in range(3))
    assert got == [3, 3, 4]  # worker 0: epochs 3 then 4; worker 1: epoch 3
    assert (st.worker_passes(0), st.worker_passes(1)) == (2, 1) and st.passes() == 2 and not st.fresh
    assert st.upcoming() == Pass(epoch=5)
    st.pin(0)
    assert st.fresh and st.worker_passes(0) == 0
    with pytest.raises(OptionError, match=f"supports up to {MAX_WORKERS} DataLoader workers"):
        st.begin_worker(MAX_WORKERS, rank=0, world=1)


def _loader_worker(board: SharedPass, out) -> None:
    st = PassState()
    st.follow(board)
    out.put(st.begin_worker(5, rank=9, world=9))


def test_a_loader_worker_takes_the_pass_its_main_process_wrote():
    board = SharedPass()
    want = Pass(epoch=12, history=((4, 3), (2, 1)), rank=1, world=2)
    board.write(want)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_loader_worker, args=(board, out))
    p.start()
    p.join()
    assert out.get(timeout=30) == want and board.read() == want


def _foreign(state: PassState, out) -> None:
    state.claim()  # a process that is neither the owner nor its DataLoader worker (an mp.spawn rank)
    assert state._owner == mp.current_process().pid
    state.pin(50)
    state.begin_worker(0, rank=0, world=1)
    out.put(state.upcoming().epoch)


def test_a_foreign_process_counts_on_a_private_copy():
    st = PassState()
    st.pin(6)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_foreign, args=(st, out))
    p.start()
    p.join()
    assert out.get(timeout=30) == 51
    assert st.pinned == Pass(epoch=6) and st.fresh  # the owner's state is as it was


def test_history_values_and_positions_inside_the_epoch():
    assert check_history([[2, 3], (1, 0)]) == ((2, 3), (1, 0))
    for bad in (None, [[1]], [[1, 2, 3]], [[1.0, 2]], [[1, False]], [[0, 2]], [[1, -1]], "ab"):
        with pytest.raises(StateError):
            check_history(bad)
    bars = synthetic_bars(3000, 2, n_symbols=2, seed=1)

    class Table:
        segments, segment_split = bars.segments, bars.segment_split

        @staticmethod
        def split_id(split):
            return None

    ranges = valid_ranges(Table(), 10)
    settings = PlanSettings(batch_size=100, shuffle=True, seed=0, mix=2, drop_last=False)
    planner = Planner(ranges=ranges, n_rows=3072, shard_rows=256, settings=settings, what="the table")
    n = planner.batches(Pass(epoch=0))
    assert n == -(-ranges.total() // 100)
    planner.check_position(0, ((1, n - 1),))
    with pytest.raises(StateError, match=rf"checkpoint 1 has {n} batches delivered per rank at world size 1"):
        planner.check_position(0, ((1, n),))
    half = planner.batches(Pass(epoch=0, history=((1, 4),), world=2))
    planner.check_position(0, ((1, 4), (2, half - 1)))
    with pytest.raises(StateError, match="checkpoint 2"):
        planner.check_position(0, ((1, 4), (2, half)))
    with pytest.raises(OptionError, match=f"^world_size={ranges.total() + 1}: more ranks than the"):
        planner.plan(Pass(epoch=0, world=ranges.total() + 1))
