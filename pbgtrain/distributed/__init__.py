"""Distributed training on torch.distributed: many trainers, one checkpoint (see docs/guides/distributed.md).

- :mod:`~pbgtrain.distributed.cluster`: launch (torchrun or ``--rank``), store, barriers, watchdog.
- :mod:`~pbgtrain.distributed.lock_server`: the lock server, in the c10d store.
- :mod:`~pbgtrain.distributed.shared`: the shared parameters, kept in agreement by all-reduce.
- :mod:`~pbgtrain.distributed.coordination`: the :class:`~pbgtrain.training.coordinator.Coordinator` of one trainer of
  many (start, stats and the once-per-iteration commit), and :func:`~pbgtrain.distributed.coordination.joined`,
  which picks this process's coordinator.
"""
