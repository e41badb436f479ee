"""The ``zephon-stream demo``: convert a real corpus, train a small model as
several ranks streaming from the store, kill it mid-shard, resume at another
world size, and show that the data matched an uninterrupted run step for step.
"""
