"""Ending a rank's producer runs without holding up the consumer.

Joining a run's threads can take tens of ms, so a run on threads is stopped
off the consumer's thread, and counted and released by that thread once it
has stopped. A helper process whose run's steps were all taken is left to
exit on its own and reaped later. ``BatchFeed`` (loader/runs/feed.py) retires
here each run it leaves.
"""

from __future__ import annotations

import threading

from zephon_stream.loader.producer.process_producer import ProcessProducer
from zephon_stream.loader.producer.stats import RunTotals
from zephon_stream.loader.runs.producer_run import ProducerRun


class RetiringRuns:
    """The runs a feed has left: stopped, then counted into ``totals`` and released."""

    def __init__(self) -> None:
        self.totals = RunTotals()
        # Runs whose producer is being stopped off the consumer's thread.
        self._stopping: list[tuple[threading.Thread, ProducerRun]] = []
        self._exiting: list[ProcessProducer] = []

    @property
    def settled(self) -> bool:
        """Whether no run is left to count and no helper left to reap."""
        return not self._stopping and not self._exiting

    @property
    def uncounted(self) -> list[ProducerRun]:
        """The runs still stopping, whose counters are not in ``totals`` yet."""
        return [run for _, run in self._stopping]

    def retire(self, run: ProducerRun | None, *, wait: bool) -> None:
        """End ``run``; with ``wait=False`` its producer stops off this thread."""
        self.settle(wait=False)
        if run is None:
            return
        if wait:
            run.producer.close()
            self._end(run)
        elif isinstance(run.producer, ProcessProducer):
            # The helper is left to exit on its own (reaped later); the
            # run's steps were all taken, so its counters are final.
            run.producer.close(wait=False)
            self._exiting.append(run.producer)
            self._end(run)
        else:
            stopper = threading.Thread(target=run.producer.close, name="zephon-retire", daemon=True)
            stopper.start()
            self._stopping.append((stopper, run))

    def settle(self, *, wait: bool) -> None:
        """Count and release the runs whose producer has stopped (``wait``: all of them)."""
        still = []
        for stopper, run in self._stopping:
            if wait:
                stopper.join()
            if stopper.is_alive():
                still.append((stopper, run))
            else:
                self._end(run)
        self._stopping = still
        self._exiting = [helper for helper in self._exiting if not helper.reaped()]

    def close(self) -> None:
        """Wait for every helper left to exit."""
        for helper in self._exiting:
            helper.close()
        self._exiting = []

    def _end(self, run: ProducerRun) -> None:
        self.totals.fold(run.counters())
        run.release()
