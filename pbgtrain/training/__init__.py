"""The parts of ``pbgtrain fit`` under the fit driver (:mod:`pbgtrain.train`).

- :mod:`~pbgtrain.training.trainer`: the :class:`~pbgtrain.training.trainer.Trainer`: model,
  resident partitions, one bucket, one iteration.
- :mod:`~pbgtrain.training.coordinator`: the run-coordination seam (the ``Coordinator`` Protocol
  and the single-process ``LocalCoordinator``; the distributed one is in :mod:`pbgtrain.distributed`).
- :mod:`~pbgtrain.training.records`: what an iteration reports (its record, the stats lines,
  partition traffic); :mod:`~pbgtrain.training.options`: what the trainer reads of the fit options.
- :mod:`~pbgtrain.plan.buckets`: bucket order, partition layout, which partitions to swap.
- :mod:`~pbgtrain.plan.batching`: the iteration plan, edge chunks, shuffling and batches.
- :mod:`~pbgtrain.training.residency`: partitions kept in memory and read ahead.
- :mod:`~pbgtrain.training.device`: device, precision and threads.
"""
