"""The streaming loader: planner -> fetch -> decode -> block cache -> assembler,
one pipeline per rank (``StreamingLoader`` in ``api.py``)."""
