"""A column's blocks of rows, read ahead on request: :class:`ColumnReader` (see
:mod:`.reader`, which reads a plan's parts, and :class:`~.feed.ColumnRounds`, which asks for the runs of
all of a worker's columns before decoding them together)."""

from __future__ import annotations

import weakref
from collections import deque
from typing import AbstractSet, Callable, Iterator, List, Optional, Protocol, Tuple, Union

from ..errors import DalistreamError
from ..plan import WorkerPlan
from ..tar.runs import Run
from .numbering import Numbering
from .policy import ErrorPolicy
from .rows import RowDecoder, Rows
from .stats import WorkerStats


class ReadItem:
    """A raw item of a plan's parts as its column takes it (:meth:`~.reader.PlanReader.items`):
    ``raw``, a :class:`Run` or one sample (a dict), ``None`` for shard problems with no item
    after them; ``numbering``, its part's (``None`` with no item); ``n_pass``, its pass over the
    parts; ``before`` and ``after``: the shard problems met before it and after it, acted on
    before it (as when samples are read one by one)."""

    __slots__ = ("raw", "numbering", "n_pass", "before", "after")

    def __init__(self, raw: Union[Run, dict, None], numbering: Optional[Numbering], n_pass: int,
                 before: List[DalistreamError], after: List[DalistreamError]) -> None:
        self.raw, self.numbering, self.n_pass, self.before, self.after = raw, numbering, n_pass, before, after


class PlanItems(Protocol):
    """What a column reads its plan with (a :class:`~.reader.PlanReader`, which this module does
    not import): its plan's raw items, their blocks, the error of a pass that gives nothing; and,
    for :class:`~.feed.ColumnRounds`, its decoder of runs, source name and run bytes."""

    rows: RowDecoder
    source_name: str

    @property
    def run_bytes(self) -> int: ...

    def items(self, plan: WorkerPlan, stats: WorkerStats, start: int = 0, gone: AbstractSet[int] = frozenset(),
              first_runs: Callable[[], Tuple[int, ...]] = tuple) -> Iterator[ReadItem]: ...

    def item_blocks(self, item: Union[Run, dict], numbering: Numbering, policy: ErrorPolicy, stats: WorkerStats,
                    next_read: Callable[[bool], bool]) -> Iterator[Rows]: ...

    def no_samples(self, plan: WorkerPlan) -> DalistreamError: ...


class ColumnReader:
    """One column's blocks of rows (an iterator of :class:`~.rows.Rows`), their raw items read
    ahead on request (:meth:`read_ahead`): so a worker's columns have their runs decoded together,
    in bulk (:func:`~.rows.decode_runs`), before each is turned into blocks in the column's order.
    Counts the rows it gives out as samples that passed (the error policy's judgement, made at
    the end too)."""

    def __init__(self, reader: PlanItems, plan: WorkerPlan, policy: ErrorPolicy, stats: WorkerStats, start: int = 0,
                 gone: AbstractSet[int] = frozenset()) -> None:
        self.reader, self.plan, self.policy, self.stats = reader, plan, policy, stats
        self.first_runs: Tuple[int, ...] = ()  # the first runs' bytes of a part opened now (read_ahead's)
        me = weakref.ref(self)
        self.items = reader.items(plan, stats, start, gone, lambda: me().first_runs)
        self.ahead: "deque[ReadItem]" = deque()
        self.ahead_samples = 0
        self.current: Iterator[Rows] = iter(())
        self.resumed = bool(start or gone)
        self.pass_rows = [0, 0]  # (pass, rows given in it)
        self.ended = False
        self.waiting = 0  # 1 while the current run's last row waits for the next item (:meth:`next_read`)
        # what the blocks' generators call back (:meth:`next_read`), and the items' (the first runs),
        # by a weak reference: a strong one would make each a cycle with this reader, whose runs'
        # buffers then wait for a collection
        self._next_read = lambda read: me().next_read(read)

    def read_ahead(self, samples: int, first_runs: Tuple[int, ...] = ()) -> List[Run]:
        """Read raw items until ``samples`` are read ahead (or the column ends); the runs read.
        ``first_runs``: the bytes of the first runs of a part opened by these reads, where they are
        to differ (:func:`~dalistream.tar.runs.sliced_runs`)."""
        runs = []
        self.first_runs = first_runs
        try:
            while self._ready() < samples and not self.ended:
                item = self._pull()
                if item is not None and isinstance(item.raw, Run):
                    runs.append(item.raw)
        finally:
            self.first_runs = ()
        return runs

    def _pull(self) -> Optional[ReadItem]:
        """The next raw item, read into ``ahead`` (``None``, and the column ended, at its end)."""
        item = next(self.items, None)
        if item is None:
            self.ended = True
        else:
            self.ahead.append(item)
            self.ahead_samples += _samples(item.raw)
        return item

    def _ready(self) -> int:
        """The samples read that can be given without reading more: a run's last waits for the
        item after it (the current run's, ``waiting``, once one is read ahead)."""
        if not self.ahead:
            return 0
        return self.waiting + self.ahead_samples - isinstance(self.ahead[-1].raw, Run)

    def next_read(self, read: bool) -> bool:
        """Whether the current run's last row can be given: the item after it read (now, if
        ``read``) and the shard problems met before that item acted on (only if ``read``: they
        come after the run's other rows), as when samples are read one by one
        (:meth:`~.reader.PlanReader.items`)."""
        if not read:
            # (the item after it read, and no problem met before it)
            ready = (self.ended and not self.ahead) or (bool(self.ahead) and not self.ahead[0].before)
            self.waiting = int(not ready)
            return ready
        if not self.ahead and not self.ended:
            self._pull()
        self.waiting = 0
        if self.ahead:
            problems, self.ahead[0].before = self.ahead[0].before, []
            self._act_on(problems)
        return True

    def _act_on(self, problems: List[DalistreamError]) -> None:
        for problem in problems:  # met before an item, acted on before it (see PlanReader.items)
            self.policy.handle(problem, "shards")
            self.stats.flush_skips()

    def close(self) -> None:
        """Read no more: the plan's parts closed now, in this thread (a column left to the
        collector would close them in whichever thread collects it, the read-ahead's included,
        whose locks it takes)."""
        self.ended = True
        self.ahead.clear()
        close = getattr(self.items, "close", None)
        if close is not None:
            close()

    def __iter__(self) -> "ColumnReader":
        return self

    def __next__(self) -> Rows:
        while True:
            block = next(self.current, None)
            if block is not None:
                self.policy.passed += block.n
                self.pass_rows[1] += block.n
                return block
            if self.ahead:
                item = self.ahead.popleft()
                self.ahead_samples -= _samples(item.raw)
            else:
                item = None if self.ended else next(self.items, None)
            if item is None:
                self.ended = True
                self.policy.check(final=True)
                raise StopIteration
            self._act_on(item.before + item.after)
            raw, numbering, n_pass = item.raw, item.numbering, item.n_pass
            if raw is None or numbering is None:
                continue
            if n_pass != self.pass_rows[0]:  # a pass over the parts gave nothing: cycling on would never end
                if not self.pass_rows[1] and not (self.pass_rows[0] == 0 and self.resumed):
                    raise self.reader.no_samples(self.plan)
                self.pass_rows = [n_pass, 0]
            self.current = self.reader.item_blocks(raw, numbering, self.policy, self.stats, self._next_read)


def _samples(item: object) -> int:
    return len(item) if isinstance(item, Run) else 0 if item is None else 1  # type: ignore[arg-type]
