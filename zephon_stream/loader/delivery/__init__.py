"""A finished ring slot as the tensors the consumer receives, in the trainer's process: on CPU as views
of the slot made once and handed over again (``device``: ``CpuDelivery``, with ``slot_views``), on CUDA
as one narrow copy widened on the device (``device``: ``CudaDelivery``, with ``widen``), and when a
delivered slot may go back to the producer (``slot_views`` on CPU, ``handback`` on CUDA). The trainer's
producer runs (``loader/runs/``) call it once a step; its tensors go to the consumer through the front
(``loader/front/``).
"""
