"""The schedule of a run, pure and seeded: what is trained when, before any tensor is touched.

- :mod:`~pbgtrain.schedule.batching`: the iteration schedule (epoch → edge path → edge chunk), the
  chunk's held-out share, shuffling and batches.
- :mod:`~pbgtrain.schedule.buckets`: bucket order, the partition layout of a bucket, which
  partitions to swap, and the scheduler that hands buckets out.
"""
