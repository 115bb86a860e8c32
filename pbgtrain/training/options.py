"""What a :class:`~pbgtrain.training.trainer.Trainer` reads of the fit options, and the checks
of those options (``--operator-init``; ``--freeze``, which needs the config).
"""

from __future__ import annotations

from typing import Any, Protocol

from pbgio.storage import LocalCache
from pbgtrain.training.residency import GIB


class TrainerOptions(Protocol):
    """What a :class:`Trainer` reads of the fit options (:class:`pbgtrain.train.FitOptions`)."""

    @property
    def device(self) -> str | None: ...

    @property
    def seed(self) -> int: ...

    @property
    def precision(self) -> str | None: ...

    @property
    def partition_memory(self) -> float | None: ...

    @property
    def read_ahead_partitions(self) -> bool | None: ...

    @property
    def remote_cache(self) -> float: ...

    @property
    def frozen_types(self) -> frozenset[str]: ...

    @property
    def operator_init(self) -> str: ...


OPERATOR_INITS = ("identity", "random")
"""How a fresh run's relation operators start (``--operator-init``): as the identity (the
original's), or drawn from ``init_scale · N(0, 1)`` like the entities. Operators read from a
checkpoint or ``init_path`` replace them either way."""


def operator_init_problem(name: str) -> str | None:
    """Why ``--operator-init name`` cannot run (None when it can).

    >>> operator_init_problem("random") is None
    True
    >>> operator_init_problem("zeros")
    "unknown operator initialisation 'zeros'; choose 'identity' or 'random'"
    """
    if name in OPERATOR_INITS:
        return None
    return f"unknown operator initialisation {name!r}; choose " + " or ".join(repr(n) for n in OPERATOR_INITS)


def remote_bucket_cache(options: TrainerOptions) -> LocalCache:
    """The bounded local store of remote edge buckets (``--remote-cache`` GiB)."""
    return LocalCache(int(options.remote_cache * GIB))


def frozen_types_problem(cfg: Any, frozen: frozenset[str] | set[str]) -> str | None:
    """Why ``--freeze`` of ``frozen`` cannot run with ``cfg`` (None when it can): a name that is
    not an entity type, or nothing left to train (every type the relations use is frozen, and
    no relation operator has parameters; the global embeddings of frozen types are frozen too).

    >>> from pbgio.example import example_config
    >>> cfg = example_config()
    >>> frozen_types_problem(cfg, {"item"}) is None and frozen_types_problem(cfg, {"user", "item"}) is None
    True
    >>> frozen_types_problem(cfg, {"users"})
    "unknown entity type 'users'; the config's entity types are 'item', 'user'"
    """
    unknown = sorted(set(frozen) - set(cfg.entities))
    if unknown:
        known = ", ".join(repr(t) for t in sorted(cfg.entities))
        names = ", ".join(repr(t) for t in unknown)
        return f"unknown entity type{'s' if len(unknown) > 1 else ''} {names}; the config's entity types are {known}"
    used = {t for r in cfg.relations for t in (r.lhs, r.rhs)}
    if not frozen or not used <= set(frozen):
        return None
    from pbgtrain.model.operators import make_dynamic_operator, make_operator

    def has_parameters(operator: str) -> bool:  # whatever the dimension (2: the smallest any operator takes)
        made = make_dynamic_operator(operator, 2, 1) if cfg.dynamic_relations else make_operator(operator, 2)
        return any(True for _ in made.parameters())

    if any(has_parameters(r.operator) for r in cfg.relations):
        return None
    return (f"every entity type of the relations is frozen ({', '.join(sorted(used))}) and no relation operator has "
            f"parameters (operator {', '.join(sorted({repr(r.operator) for r in cfg.relations}))}; global "
            "embeddings are frozen with their types): nothing would train; freeze fewer types")
