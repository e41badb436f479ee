"""The writer: corpus readers, tokenizer adapters, token inputs (flat arrays,
Megatron indexed datasets, id columns, ``datasets`` folders) and their checks,
the shard builder, ``write_dataset`` and the merge of parts written by
launcher ranks."""
