"""The loader's public face: ``StreamingLoader`` (``api``, its arguments checked in ``args``), what it
shows of itself (``introspection``), its state out and the seek in (``checkpointing``), the audit log of
the steps it handed over (``audit``), and ``EvalLoader``, one pass over held-out datasets through the same
pipeline on threads (``evaluation``). Here a batch leaves the loader: ``next()`` hands the consumer the
tensors delivery (``loader/delivery/``) made of a ring slot.
"""
