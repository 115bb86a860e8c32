"""``tools/card_kit.py prepare DIR``: everything a card whose image has only Python and torch needs
to run ``tools/card_run.py``, written on a CPU machine into one folder of at most 64 MiB.

A card's image may carry torch and nothing else, and may reach no package index. The kit holds:

- ``wheels/``: the wheels (CPython ``--python-version``, manylinux x86_64, binary only) of what
  pbg needs besides torch (the ``dependencies`` of pyproject.toml less torch) and of what its
  tests need (pytest, hypothesis), with every dependency pip resolves for them. The versions are
  those of constraints/dev.txt where it pins one, else those installed in the environment that
  runs this tool (the ones the test suite passes with here), dependencies included. polars goes
  in only if the kit stays within its limit with it (its runtime wheel alone is 51 MiB); else
  ``kit.json`` says so, and the tests that need it skip on the card, saying why.
- ``requirements.txt``: what ``card_run.py`` installs from ``wheels/`` (``pip install --no-index``).
- ``layouts/fb15k-237/``: the FB15k-237 layout of ``tools/bench_gpu.py --check`` (the recipe's
  config and ``data/``), imported here: importing needs polars. The partitioned fit of the check
  writes its graph on the card (numpy and h5py only), so nothing of it travels.
- ``kit.json``: what is in it, what was left out and why, its size, the commit it was made from.

pbg itself does not travel in the kit: the card runs the checkout's own working tree (the device
machine gets a copy of it, with this git-ignored folder carried beside).

    .venv/bin/python tools/card_kit.py prepare card-kit                    # Python 3.12 (the card's)
    .venv/bin/python tools/card_kit.py prepare --python-version 3.11 /tmp/kit   # this machine's, for a dry run

The folder's size is printed; over ``--limit-mib`` (64) the tool stops with exit code 1 and
writes no ``kit.json`` (``card_run.py`` refuses a folder without one).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
LIMIT_MIB = 64.0
MIB = 1 << 20
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
ON_THE_IMAGE = ("torch",)  # the card's image brings it (a CUDA build): never in the kit
IF_IT_FITS = ("polars",)  # in only where the kit stays within its limit with it
FOR_THE_TESTS = ("pytest", "hypothesis")
MANIFEST = "kit.json"


class KitError(Exception):
    """A kit that cannot be made as asked (too large, a download or an import that failed)."""


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503).

    >>> canonical("RapidFuzz"), canonical("typing_extensions")
    ('rapidfuzz', 'typing-extensions')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    """The distribution named by a requirement string.

    >>> requirement_name("pydantic>=2.6,<3"), requirement_name("moto[server,s3]>=5")
    ('pydantic', 'moto')
    """
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if match is None:
        raise KitError(f"not a requirement: {spec!r}")
    return canonical(match.group(1))


def runtime_dependencies(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The names of pbg's ``[project] dependencies`` (what ``pip install pbg`` brings)."""
    import tomllib

    with pyproject.open("rb") as f:
        return [requirement_name(spec) for spec in tomllib.load(f)["project"]["dependencies"]]


def pinned_versions(path: Path = REPO / "constraints" / "dev.txt") -> dict[str, str]:
    """The ``name==version`` pins of a constraints file."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def installed_versions() -> dict[str, str]:
    """Every distribution installed where this tool runs, by name (local versions such as
    ``+cpu`` left out: no index has them)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and "+" not in version:
            found[canonical(name)] = version
    return found


def kit_requirements(runtime: Iterable[str], pins: Mapping[str, str], installed: Mapping[str, str],
                     *, with_optional: bool) -> list[str]:
    """``name==version`` of everything the kit asks pip for: pbg's runtime dependencies less
    torch (and less polars unless ``with_optional``), then pytest and hypothesis; each version
    the constraints' pin, else the installed one.

    >>> kit_requirements(["torch", "numpy", "polars", "rapidfuzz"], {"rapidfuzz": "3.14.6"},
    ...                  {"numpy": "2.4.6", "polars": "2.1.0", "pytest": "9.2.0", "hypothesis": "6.1"},
    ...                  with_optional=False)
    ['numpy==2.4.6', 'rapidfuzz==3.14.6', 'pytest==9.2.0', 'hypothesis==6.1']
    """
    names = [n for n in runtime if n not in ON_THE_IMAGE and (with_optional or n not in IF_IT_FITS)]
    out = []
    for name in [*names, *FOR_THE_TESTS]:
        version = pins.get(name) or installed.get(name)
        if version is None:
            raise KitError(f"{name}: no version to pin (neither constraints/dev.txt nor this environment has it); "
                           "install the project's test extra here first "
                           "(pip install -c constraints/dev.txt -e '.[test]')")
        out.append(f"{name}=={version}")
    return out


def folder_bytes(path: Path) -> int:
    """The bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_size(path: Path, limit_mib: float) -> int:
    """The folder's bytes; a :class:`KitError` saying both sizes when it is over ``limit_mib``."""
    size = folder_bytes(path)
    if size > limit_mib * MIB:
        raise KitError(f"{path}: {size / MIB:.1f} MiB, over the limit of {limit_mib:g} MiB (what travels to the card "
                       "beside the working tree); leave something out")
    return size


def download(dest: Path, requirements: list[str], constraints: Mapping[str, str], python_version: str) -> None:
    """``pip download`` of ``requirements`` and their dependencies into ``dest``: binary wheels for
    CPython ``python_version`` on manylinux x86_64, every version held to ``constraints``."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{name}=={version}\n" for name, version in sorted(constraints.items())
                        if name not in ON_THE_IMAGE))
        constraint_file = f.name
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", *platforms, "-c", constraint_file,
            "-d", str(dest), *requirements]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    finally:
        Path(constraint_file).unlink()
    if done.returncode != 0:
        tail = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING: Location"))
        raise KitError(f"pip download failed (exit {done.returncode}):\n{tail[-3000:]}")


def commit_of(repo: Path = REPO) -> str:
    """The checkout's commit (with ``+changes`` when its working tree differs)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


@dataclass
class Manifest:
    """``kit.json``."""

    python_version: str
    platforms: list[str]
    requirements: list[str]
    wheels: dict[str, int]  # file name: bytes
    left_out: dict[str, str]  # name: why
    layouts: list[str]
    bytes: int
    limit_mib: float
    commit: str
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def prepare(dest: Path, *, python_version: str = "3.12", limit_mib: float = LIMIT_MIB, optional: str = "auto",
            fb15k: bool = True) -> Manifest:
    """Write the kit into ``dest`` (see the module doc); a :class:`KitError` when it cannot be
    made or is over ``limit_mib``. ``optional``: ``auto`` (polars if it fits), ``no``."""
    started = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).unlink(missing_ok=True)  # a kit is whole or has no manifest
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    installed = installed_versions()
    constraints = {**installed, **pinned_versions()}
    requirements = kit_requirements(runtime_dependencies(), pinned_versions(), installed, with_optional=False)
    print(f"downloading {len(requirements)} requirements and their dependencies (CPython {python_version}, "
          f"manylinux x86_64): {', '.join(requirements)}", flush=True)
    download(wheels, requirements, constraints, python_version)
    layouts = []
    if fb15k:
        sys.path.insert(0, str(TOOLS))
        from bench_quality import DATASETS
        from gpu_check import prepare as prepare_fb15k

        archive = DATASETS / "fb15k-237.tar.gz"
        if not archive.is_file():
            raise KitError(f"{archive} is absent: the FB15k-237 lines of the check need it (the project's shared "
                           "folder beside the checkout); --no-fb15k makes a kit without them")
        print("importing FB15k-237 (the check's 1-vs-all lines)", flush=True)
        prepare_fb15k(dest / "layouts")
        layouts.append("fb15k-237")
    left_out = {"torch": "the card's image brings it (a CUDA build)"}
    for name in IF_IT_FITS:
        version = constraints.get(name)
        if optional == "no" or version is None:
            left_out[name] = "left out (--optional no)" if optional == "no" else "not installed here"
            continue
        with tempfile.TemporaryDirectory(prefix=f"kit-{name}-") as scratch:
            download(Path(scratch), [f"{name}=={version}"], constraints, python_version)
            extra = {p.name: p.stat().st_size for p in Path(scratch).glob("*.whl") if not (wheels / p.name).exists()}
            would_be = folder_bytes(dest) + sum(extra.values())
            if would_be <= limit_mib * MIB:
                for file in extra:
                    shutil.move(str(Path(scratch) / file), wheels / file)
                requirements.append(f"{name}=={version}")
            else:
                left_out[name] = (f"{name} {version} ({sum(extra.values()) / MIB:.1f} MiB with its dependencies) would "
                                  f"make the kit {would_be / MIB:.1f} MiB, over {limit_mib:g}: the tests that need it "
                                  "skip on the card, saying so")
    (dest / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
    size = folder_bytes(dest)
    print(f"{dest}: {size / MIB:.1f} MiB (limit {limit_mib:g} MiB)", flush=True)
    check_size(dest, limit_mib)
    manifest = Manifest(python_version, list(PLATFORMS), requirements,
                        {p.name: p.stat().st_size for p in sorted(wheels.glob("*.whl"))}, left_out, layouts, size,
                        limit_mib, commit_of(), time.perf_counter() - started)
    (dest / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="write the kit into DIR (its size printed; refused over the limit)")
    make.add_argument("dir", type=Path)
    make.add_argument("--python-version", default="3.12", help="the card's Python (major.minor)")
    make.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    make.add_argument("--optional", choices=["auto", "no"], default="auto",
                      help="auto: polars in where the kit stays within its limit with it")
    make.add_argument("--no-fb15k", action="store_true", help="leave the FB15k-237 layout out")
    args = parser.parse_args(argv)
    try:
        manifest = prepare(args.dir, python_version=args.python_version, limit_mib=args.limit_mib,
                           optional=args.optional, fb15k=not args.no_fb15k)
    except KitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for name, why in manifest.left_out.items():
        print(f"left out: {name}: {why}")
    print(f"{len(manifest.wheels)} wheels, layouts: {', '.join(manifest.layouts) or 'none'}; "
          f"{manifest.bytes / MIB:.1f} MiB in {manifest.seconds:.0f} s; carry {args.dir} to the card and run "
          f"python3 tools/card_run.py --kit {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
