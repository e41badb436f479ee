"""The writer: corpus readers, tokenizer adapters, the shard builder,
``write_dataset`` and the merge of parts written by launcher ranks."""
