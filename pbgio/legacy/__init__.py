"""Read the legacy (.pt era) PyTorch-BigGraph layout and migrate it to the current one.

* :mod:`pbgio.legacy.spec`: the legacy layout declared once (file names, renames);
* :mod:`pbgio.legacy.pickles`: the safe loader for the pickled ``.pt`` files;
* :mod:`pbgio.legacy.reader`: typed readers that detect the variant;
* :mod:`pbgio.legacy.state`: tensors, model parameters and optimizer states;
* :mod:`pbgio.legacy.migrate`: :func:`~pbgio.legacy.migrate.plan_migration` and
  :func:`~pbgio.legacy.migrate.migrate`, behind ``pbgio convert --from legacy``.

These modules import torch (the legacy files are torch pickles); ``pbgio validate``
does not import them.
"""
