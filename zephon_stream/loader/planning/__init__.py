"""What this rank reads and when, as arithmetic on the plan (no threads, no I/O): the user's phases
resolved into the plan's ``ScheduleOrder`` (``schedule``), one rank's view of an order with its slices,
horizons and memory bound (``rank_layout``, with the bound's formulas in ``memory``), and the sliding plan
of the steps ahead that says which blocks to fetch and when a block may be dropped (``planner``). The
producer's pipeline (``loader/producer/``) follows the planner: it fetches the horizon's blocks
(``loader/blocks/``) and assembles each planned step into a ring slot (``loader/ring/``).
"""
