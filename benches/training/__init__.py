"""Spark -> training ranks: creditflow against the ways PySpark users feed PyTorch today.

One Spark ``local[2]`` session computes TPC-H ``lineitem`` features (sf0.1: 600,572 rows of
numeric columns, generated in the Spark tasks), and every contender delivers that DataFrame to
two training ranks (separate processes, started and past their imports before the clock
starts), 1024-row batches of torch tensors, shuffled, three epochs. The contenders
(:mod:`benches.training.contenders`):

* ``creditflow``: ``creditflow.spark.send(df, [addr0, addr1], secret)`` into one
  ``Receiver(rank=r, world_size=2, batch_size=1024, shuffle=True, ...)`` per rank, read through
  ``creditflow.torch``'s ``IterableDataset`` with ``DataLoader(batch_size=None)``: no storage
  in between, epoch 0 while Spark computes, later epochs from the receivers' memory;
* ``creditflow-today``: the harness's check before ranks exist, one ``Receiver(spill=True,
  replay=True)`` per rank, each fed half of the DataFrame's source partitions;
* ``petastorm``: ``make_spark_converter`` (a Parquet cache) + ``make_torch_dataloader``
  with ``cur_shard``/``shard_count``;
* ``mosaic``: ``dataframe_to_mds`` (MDS shards) + ``StreamingDataset``;
* ``hf-datasets``: ``Dataset.from_spark`` (an Arrow cache) + ``split_dataset_by_node``;
* ``parquet``: ``df.write.parquet`` then pyarrow in each rank.

Per contender and round: time to the first batch (from the moment the driver starts the Spark
job), each epoch's time, the total, CPU seconds, bytes written to the storage layer, the peak
of its scratch directory, peak RSS per rank, batches per rank per epoch and whether each row
came once per epoch. ``python -m benches.training --help``; ``make bench-training`` runs it in
its own environment (``.venv-bench``, see ``benches/training/requirements.txt``).
"""
