"""Ray integration: ``ShardSink``, a Ray Data ``Datasink`` writing a zephon-stream dataset.

``ds.write_datasink(zephon_stream.ray.ShardSink(output, tokenizer=..., text_column="text"))``;
``tokens_column=`` takes lists of token ids instead. Converting files on a Ray
cluster needs no Dataset: ``write_dataset(..., engine="ray")`` or
``zephon-stream write ... --engine ray``. Needs ``pip install 'zephon-stream[ray]'``.
"""

from zephon_stream.writer.ray_sink import ShardSink, sink_part_name

__all__ = ["ShardSink", "sink_part_name"]
