"""Where a step's tokens come from: the open datasets (``streams``: a ``Stream`` as the user names it, a
``StreamSource`` with its store and metadata), where each block's frame lies (``metadata``: a format 1.0
manifest, or a 1.1 header and the index pages a rank's blocks need), the fetch and decode threads that
read a block's byte range and decompress it (``fetcher``), and the block cache that holds decoded blocks
within the memory bound until no planned step needs them (``cache``). The planner (``loader/planning/``)
says which blocks to read and when; the assembler (``loader/producer/``) copies each row's tokens out of
the cached blocks into a ring slot (``loader/ring/``).
"""
