"""Distributed training on torch.distributed: many trainers, one checkpoint (see docs/guides/distributed.md).

- :mod:`~pbgtrain.distributed.cluster`: launch (torchrun or ``--rank``), store, barriers, watchdog.
- :mod:`~pbgtrain.distributed.scheduler`: the lock server, in the c10d store.
- :mod:`~pbgtrain.distributed.shared`: the shared parameters, kept in agreement by all-reduce.
- :mod:`~pbgtrain.distributed.coordination`: start, stats and the once-per-iteration commit.
"""
