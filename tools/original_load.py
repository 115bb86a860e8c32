"""Run by the ORIGINAL PyTorch-BigGraph's interpreter: load checkpoints with the original's own code.

Usage (``tools/kill_distributed.py`` runs it once for a campaign's kept final checkpoints)::

    <original venv>/bin/python tools/original_load.py --result OUT.json DIR [DIR ...]

Each ``DIR`` holds ``config.json`` (the layout's config), ``entities/entity_count_*.txt`` and
``checkpoint/`` (the version file, the model and every embeddings file of the committed
version). For each: ``ConfigSchema.from_dict`` of the config (its paths pointed into DIR; keys
the original does not know, if any, dropped), then ``CheckpointManager(checkpoint).read(type,
part)`` of every partition (the tensor must be ``(entity count, dimension)``, its optimizer state
present), ``read_model`` and ``make_model(config).load_state_dict(state, strict=False)`` with no
unexpected and no missing key. Writes ``{DIR: [problems]}`` to ``OUT.json`` (an empty list: loaded).

Never imported by pbg's environment (it imports ``torchbiggraph``, which only the side
environment has).
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any


def _known(raw: dict[str, Any]) -> dict[str, Any]:
    from torchbiggraph.config import ConfigSchema

    names = {f.name for f in ConfigSchema.__attrs_attrs__}
    return {k: v for k, v in raw.items() if k in names}


def load(directory: Path) -> list[str]:
    from torchbiggraph.checkpoint_manager import CheckpointManager
    from torchbiggraph.config import ConfigSchema
    from torchbiggraph.model import make_model

    problems: list[str] = []
    raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    raw["entity_path"] = str(directory / "entities")
    raw["edge_paths"] = [str(directory / "edges")]
    raw["checkpoint_path"] = str(directory / "checkpoint")
    config = ConfigSchema.from_dict(_known(raw))
    cm = CheckpointManager(config.checkpoint_path)
    if cm.checkpoint_version <= 0:
        return [f"the original sees checkpoint version {cm.checkpoint_version}"]
    for etype, entity in config.entities.items():
        for part in range(entity.num_partitions):
            try:
                embs, optim_state = cm.read(etype, part)
            except Exception as exc:
                problems.append(f"read {etype}/{part}: {type(exc).__name__}: {exc}")
                continue
            dim = config.entity_dimension(etype)
            rows = int((directory / "entities" / f"entity_count_{etype}_{part}.txt").read_text().strip())
            if tuple(embs.shape) != (rows, dim):
                problems.append(f"{etype}/{part}: shape {tuple(embs.shape)}, expected {(rows, dim)}")
            if optim_state is None:
                problems.append(f"{etype}/{part}: no optimizer state")
    try:
        state_dict, _ = cm.read_model()
        model = make_model(config)
        if state_dict is None:
            problems.append("read_model: no model state")
        else:
            loaded = model.load_state_dict(state_dict, strict=False)
            if loaded.unexpected_keys or loaded.missing_keys:
                problems.append(f"load_state_dict: unexpected keys {sorted(loaded.unexpected_keys)}, missing "
                                f"keys {sorted(loaded.missing_keys)}")
    except Exception as exc:
        problems.append(f"model: {type(exc).__name__}: {exc}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    out: dict[str, list[str]] = {}
    for directory in args.dirs:
        try:
            out[str(directory)] = load(directory)
        except Exception as exc:
            out[str(directory)] = [f"{type(exc).__name__}: {exc} "
                                   f"({traceback.extract_tb(exc.__traceback__)[-1].name})"]
    args.result.write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
