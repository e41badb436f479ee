"""What fills the ring, and the process it runs in: the pipeline that plans, fetches, decodes and
assembles each step into a free slot (``pipeline``, with ``assembler`` copying the rows and ``stats``
counting what it did), a run's picklable description and the in-process way to run it
(``spec``: ``ProducerSpec``, ``ThreadProducer``), and the helper process: its main, run in the helper's
own interpreter (``helper_main``), the trainer's handle that starts it and takes its steps
(``process_producer``: ``ProcessProducer``), and what it reports over its socket (``reports``). A step
it finished waits in its ring slot (``loader/ring/``) for delivery (``loader/delivery/``).
"""
