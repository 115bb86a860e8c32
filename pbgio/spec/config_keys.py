"""Config keys: the one conversion of legacy mixedCase keys to snake_case, the original's.

The original's loader (``torchbiggraph/schema.py``, ``mixed_case_to_lowercase``, called by
``Schema.from_dict`` on every key of the config, its entities and relations) writes each
uppercase letter as ``_`` and its lowercase, and leaves every other character as it is. So
runs of capitals become one word per letter and a leading capital gets a leading underscore;
pbgio reads keys exactly so (:func:`pbgio.config.snake_case_keys`, the legacy migration
:func:`pbgio.legacy.spec.migrate_config_dict`), and only so.

>>> [mixed_case_to_snake_case(k) for k in ("numEpochs", "entityPath", "hogwild_delay", "lhsID")]
['num_epochs', 'entity_path', 'hogwild_delay', 'lhs_i_d']
>>> mixed_case_to_snake_case("NumEpochs")
'_num_epochs'
"""

from __future__ import annotations


def mixed_case_to_snake_case(key: str) -> str:
    """``key`` as the original's loader reads it: ``numEpochs`` -> ``num_epochs``, ``lhsID`` ->
    ``lhs_i_d`` (every character for which ``str.isupper`` holds becomes ``_`` + its lowercase)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def is_mixed_case(key: str) -> bool:
    """Whether the original's loader reads ``key`` as another name.

    >>> is_mixed_case("numEpochs"), is_mixed_case("num_epochs"), is_mixed_case("x1")
    (True, False, False)
    """
    return mixed_case_to_snake_case(key) != key
