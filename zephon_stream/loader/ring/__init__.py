"""The shared memory a step is written into and handed over through, mapped by the trainer and the
helper process alike: the batch ring and its slot layout (``shared_ring``), what a slot holds about packed
documents (``row_documents``), and the words of the ring's header that each side reads without a system call:
the slots handed back and the ones the producer may fill (``free_slots``), the steps the helper posted
(``step_board``) and the lock that says it lives (``liveness``). The producer (``loader/producer/``)
fills a slot; delivery (``loader/delivery/``) turns it into the consumer's tensors and hands it back.
"""
