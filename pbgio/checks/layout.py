"""The rules of a layout as a whole: which directories and files exist where the config says.

>>> print(edge_file_missing("edges/edges_0_1.h5", (0, 1), (1, 2)))
edges/edges_0_1.h5: expected bucket (0, 1) of the 1x2 grid, found no file [edge-file-missing]
"""

from __future__ import annotations

from collections.abc import Sequence

from pbgio.errors import Issue
from pbgio.spec.rules import rule


def path_missing(file: str | None, message: str, dataset: str | None = None) -> Issue:
    """``path-missing``: a file or directory the config (or a reader) names is absent or is
    something else; ``message`` says what was expected and found."""
    return rule("path-missing").issue(file, dataset, message)


def checkpoint_path_occupied(file: str | None, found: str | None, dataset: str | None = None) -> Issue | None:
    """``path-missing``: ``checkpoint_path`` is its directory, or nothing before training (the
    directory is made then). ``found`` is what stands there, as :func:`pbgio.storage.found_at`
    words it (:meth:`pbgio.layout.Layout.checkpoint_path_found`), None where nobody can tell (a
    remote store makes prefixes as they are written). The validator and ``pbgtrain fit`` (before
    it locks the directory) both ask this.

    >>> checkpoint_path_occupied("model", "nothing") is None, checkpoint_path_occupied("model", "a directory") is None
    (True, True)
    >>> print(checkpoint_path_occupied("model", "a file"))
    model: expected the checkpoint_path directory (or nothing, before training), found a file [path-missing]
    """
    if found in (None, "nothing", "a directory"):
        return None
    return path_missing(file, f"expected the checkpoint_path directory (or nothing, before training), found {found}",
                        dataset)


def layout_unrecognized(file: str | None, *, directory: bool) -> Issue:
    """``layout-unrecognized``: the path given to the validator holds no PBG artifact."""
    return rule("layout-unrecognized").issue(
        file, None, "expected entity files, edge buckets, checkpoint files or a config.json, found none" if directory
        else "expected a config (.json), a bucket (edges_L_R.h5) or a checkpoint file (*.vN.h5), found another file")


def legacy_layout(file: str | None, directory: str | None = None, found: str = "a legacy .pt file") -> Issue:
    """``legacy-layout``: ``found`` (a file of the legacy .pt layout, a bucket without
    format_version) in ``directory`` (None: the single legacy file validated), which the message
    tells how to migrate."""
    if directory is None:
        return rule("legacy-layout").issue(
            file, None, f"expected a current-layout file, found {found} (migrate its directory with "
            "`pbgio convert --from legacy SRC DST`)")
    return rule("legacy-layout").issue(
        file, None, f"expected the current layout, found {found} (migrate the directory with "
        f"`pbgio convert --from legacy {directory} DST`)")


def edge_file_missing(file: str | None, bucket: tuple[int, int], grid: tuple[int, int], *,
                      first: Sequence[tuple[int, int]] = (), total: int = 1) -> Issue:
    """``edge-file-missing``: ``bucket`` (lhs, rhs) of the partition ``grid`` has no file; with ``total``
    > 1, one issue for the ``total`` buckets of an edge path that have none, ``first`` (the first few,
    ``bucket`` the first of them) listed and ``total`` its count.

    >>> print(edge_file_missing("edges_0_2.h5", (0, 2), (1000, 1000), first=((0, 2), (0, 3)), total=999_998))
    edges_0_2.h5: expected buckets (0, 2), (0, 3) and 999,996 more of the 1000x1000 grid (999,998 bucket files \
missing), found no file [edge-file-missing]
    """
    if total <= 1:
        return rule("edge-file-missing").issue(
            file, None, f"expected bucket ({bucket[0]}, {bucket[1]}) of the {grid[0]}x{grid[1]} grid, found no file")
    shown = list(first) or [bucket]
    more = f" and {total - len(shown):,} more" if total > len(shown) else ""
    return rule("edge-file-missing").issue(
        file, None, f"expected buckets {', '.join(f'({lhs}, {rhs})' for lhs, rhs in shown)}{more} of the "
                    f"{grid[0]}x{grid[1]} grid ({total:,} bucket files missing), found no file", count=total)


def edge_file_extra(file: str | None, bucket: tuple[int, int], grid: tuple[int, int]) -> Issue | None:
    """``edge-file-extra``: a bucket file outside the partition ``grid``."""
    if bucket[0] < grid[0] and bucket[1] < grid[1]:
        return None
    return rule("edge-file-extra").issue(
        file, None, f"expected buckets within the {grid[0]}x{grid[1]} grid, found ({bucket[0]}, {bucket[1]})")
