"""Read the legacy (.pt era) PyTorch-BigGraph layout and migrate it to the current one.

* :mod:`pbgio.legacy.spec`: the legacy layout declared once (file names, renames);
* :mod:`pbgio.legacy.pickles`: the safe loader for the pickled ``.pt`` files;
* :mod:`pbgio.legacy.reader`: typed readers that detect the variant;
* :mod:`pbgio.legacy.state`: tensors, model parameters and optimizer states;
* :mod:`pbgio.legacy.plan`: the migration plan, its steps and how it prints;
* :mod:`pbgio.legacy.planner`: :func:`~pbgio.legacy.planner.plan_migration`, one step per
  file of DST, with :mod:`pbgio.legacy.run` (the run's config and where its directories go) and
  :mod:`pbgio.legacy.resolver` (stored config paths found under SRC);
* :mod:`pbgio.legacy.actions`: what each step writes;
* :mod:`pbgio.legacy.migrate`: :func:`~pbgio.legacy.migrate.plan_migration` and
  :func:`~pbgio.legacy.migrate.migrate`, behind ``pbgio convert --from legacy``.

Test layouts of the legacy kind are written by :mod:`pbgio.testing.legacy_layouts`.

These modules import torch (the legacy files are torch pickles); ``pbgio validate``
does not import them.
"""
