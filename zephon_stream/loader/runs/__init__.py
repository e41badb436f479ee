"""The trainer's side of one rank's producer runs: every layout the loader reads and the ring slot of
each (``phase_layouts``: ``LayoutBook``), one run as the trainer takes its steps, with its ring, delivery
and producer and the short way to a plain step (``producer_run``: ``ProducerRun``, ``SteadySteps``),
and the runs of a loader, started on threads or in the helper, started ahead of a phase boundary,
switched to and retired (``feed``: ``BatchFeed``), and the runs it has left, stopped off the
consumer's thread, then counted and released (``retiring``: ``RetiringRuns``). Each step a run hands
over goes to the consumer through ``StreamingLoader`` (``loader/front/``).
"""
