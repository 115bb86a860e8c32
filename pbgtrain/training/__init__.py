"""The parts of ``pbgtrain fit`` under the fit driver (:mod:`pbgtrain.train`).

- :mod:`~pbgtrain.training.trainer`: the :class:`~pbgtrain.training.trainer.Trainer`: the model,
  one bucket, one iteration.
- :mod:`~pbgtrain.training.fit_plan`: the fit options parsed once (``resolve_fit`` → ``FitPlan``).
- :mod:`~pbgtrain.training.coordinator`: the run-coordination seam (the ``Coordinator`` Protocol,
  the frozen ``Placement``, and the single-process ``LocalCoordinator``; the distributed one is in
  :mod:`pbgtrain.distributed`).
- :mod:`~pbgtrain.training.residency`: a trainer's partitions (``PartitionStore``): resident,
  kept in memory, read ahead.
- :mod:`~pbgtrain.training.edge_chunks`: the edge chunks it trains, checked and read ahead.
- :mod:`~pbgtrain.training.held_out`: the held-out edges ranked before and after each bucket.
- :mod:`~pbgtrain.training.records`: what an iteration reports (its record, the stats lines,
  partition traffic).
- :mod:`~pbgtrain.training.device`: device, precision and threads.

The plan they follow (iterations, buckets, batches) is :mod:`pbgtrain.schedule`.
"""
