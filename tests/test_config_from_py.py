"""The original's Python config files: ``pbgio.python_config``, ``pbgio config from-py`` and ``pbgtrain fit cfg.py``.

Each file is executed in a subprocess; these tests check what comes back (enum members,
tuples, overrides the original's way), every error (naming the file, no traceback), the
rewriting of relative paths for a JSON file written elsewhere, and training from a ``.py``.
The same files and overrides loaded by the original PyTorch-BigGraph too, and the two configs
compared, are in the interop suite (tests/interop/test_config_from_py_interop.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pbgio.cli.commands import app as pbgio_app
from pbgio.config import CONFIG_KEYS, ConfigSchema
from pbgio.errors import ConfigError
from pbgio.example import build_example
from pbgio.layout import config_from_python, load_python_config
from pbgio.python_config import rebase_paths
from pbgio.storage import local_path
from pbgtrain.cli import app as pbgtrain_app
from pbgtrain.config import load_run_config

# Modelled on the original's torchbiggraph/examples/configs/fb15k_config_cpu.py.
FB15K_CONFIG = '''\
#!/usr/bin/env python3


def get_torchbiggraph_config():

    config = dict(  # noqa
        # I/O data
        entity_path="data/FB15k",
        edge_paths=[
            "data/FB15k/freebase_mtr100_mte100-train_partitioned",
            "data/FB15k/freebase_mtr100_mte100-valid_partitioned",
            "data/FB15k/freebase_mtr100_mte100-test_partitioned",
        ],
        checkpoint_path="model/fb15k",
        # Graph structure
        entities={"all": {"num_partitions": 1}},
        relations=[
            {
                "name": "all_edges",
                "lhs": "all",
                "rhs": "all",
                "operator": "complex_diagonal",
            }
        ],
        dynamic_relations=True,
        # Scoring model
        dimension=400,
        global_emb=False,
        comparator="dot",
        # Training
        num_epochs=50,
        num_uniform_negs=1000,
        loss_fn="softmax",
        lr=0.1,
        regularization_coef=1e-3,
        # Evaluation during training
        eval_fraction=0,  # to reproduce results, we need to use all training data
    )

    return config
'''

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def returning(body: str) -> str:
    """A config file whose get_torchbiggraph_config() returns ``body`` (a Python expression)."""
    return f"def get_torchbiggraph_config():\n    return {body}\n"


MINIMAL = ('dict(entities={"e": {"num_partitions": 1}}, relations=[{"name": "r", "lhs": "e", "rhs": "e"}], '
           'dimension=8, entity_path="data", edge_paths=["data/train"], checkpoint_path="model")')


def pbgio(*args: str) -> subprocess.CompletedProcess[str]:
    result = CliRunner().invoke(pbgio_app, list(args))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def pbgtrain(*args: str) -> subprocess.CompletedProcess[str]:
    result = CliRunner().invoke(pbgtrain_app, list(args))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def problem(path: Path, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_python_config(path, echo=None, **kwargs)  # type: ignore[arg-type]
    assert len(info.value.issues) == 1
    assert str(path) in str(info.value)
    return info.value


@pytest.fixture
def fb15k(tmp_path: Path) -> Path:
    return write(tmp_path / "configs" / "fb15k_config_cpu.py", FB15K_CONFIG)


# --------------------------------------------------------------------------- loading


def test_realistic_config_loads_and_validates(fb15k: Path) -> None:
    cfg = config_from_python(fb15k, echo=None)
    assert cfg.dimension == 400 and cfg.dynamic_relations and not cfg.global_emb
    assert cfg.relations[0].operator == "complex_diagonal" and cfg.comparator == "dot"
    assert cfg.edge_paths[2] == "data/FB15k/freebase_mtr100_mte100-test_partitioned"
    assert cfg.eval_fraction == 0 and cfg.regularization_coef == 1e-3
    assert list(json.loads(cfg.to_json())) == list(CONFIG_KEYS)  # all keys, like the original's config.json


def test_overrides_the_original_way(fb15k: Path) -> None:
    raw = load_python_config(fb15k, ["edge_paths=a,b", "num_epochs=5", "relations.0.all_negs=true",
                                     "entities.all.num_partitions=4", "lr=0.5", "bucket_order=OUTSIDE_IN",
                                     "max_norm=none"], echo=None)
    assert raw["edge_paths"] == ["a", "b"]  # list fields split on commas
    assert raw["num_epochs"] == 5 and type(raw["num_epochs"]) is int  # int fields converted
    assert raw["lr"] == 0.5
    assert raw["relations"][0]["all_negs"] == "true"  # other fields: a string the schema parses
    assert raw["entities"]["all"] == {"num_partitions": 4}
    assert raw["max_norm"] is None
    cfg = config_from_python(fb15k, ["relations.0.all_negs=true", "bucket_order=OUTSIDE_IN"], echo=None)
    assert cfg.relations[0].all_negs is True and cfg.bucket_order == "outside_in"


def test_bad_overrides_are_each_named(fb15k: Path) -> None:
    bad = ["numEpochs=3", "relations.1.name=x", "dimension=big", "entities.user.num_partitions=2",
           "num_epochs", "dimension.x=1", "relations.first.name=x"]
    with pytest.raises(ConfigError) as info:
        load_python_config(fb15k, ["lr=0.5", *bad], echo=None)
    assert [i.rule for i in info.value.issues] == ["config-schema"] * len(bad)
    for override, issue in zip(bad, info.value.issues, strict=True):
        assert repr(override) in issue.message
    messages = "\n".join(i.message for i in info.value.issues)
    assert "did you mean 'num_epochs'" in messages and "expected an int, found 'big'" in messages
    assert "expected an index below 1" in messages and "no key 'user'" in messages


def test_schema_problems_after_overrides_keep_their_rules(fb15k: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_python(fb15k, ["dimension=0", "relations.0.operator=rotate"], echo=None)
    assert {i.dataset for i in info.value.issues} == {"dimension", "relations[0].operator"}
    assert {i.rule for i in info.value.issues} == {"config-schema"}


def test_enum_members_tuples_and_the_config_directory_on_sys_path(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the original's module, found because the config's directory comes first on sys.path.
    write(tmp_path / "configs" / "torchbiggraph" / "__init__.py", "")
    write(tmp_path / "configs" / "torchbiggraph" / "config.py", """\
        from enum import Enum
        class BucketOrder(Enum):  # the original's dumper writes the lowercase name, not the value
            RANDOM = 1
            INSIDE_OUT = 2
            OUTSIDE_IN = 3
        """)
    write(tmp_path / "configs" / "shared.py", "DIMENSION = 32\n")
    cfg_py = write(tmp_path / "configs" / "cfg.py", """\
        import os
        from torchbiggraph.config import BucketOrder
        from shared import DIMENSION

        def get_torchbiggraph_config():
            return dict(entities={"e": {"num_partitions": 1}},
                        relations=({"name": "r", "lhs": "e", "rhs": "e"},),
                        dimension=DIMENSION, entity_path=os.getcwd(), edge_paths=("data/train",),
                        checkpoint_path="model", bucket_order=BucketOrder.OUTSIDE_IN)
        """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    raw = load_python_config(cfg_py, echo=None)
    assert raw["bucket_order"] == "outside_in"
    assert raw["edge_paths"] == ["data/train"] and isinstance(raw["relations"], list)
    assert raw["dimension"] == 32
    assert Path(raw["entity_path"]) == elsewhere.resolve()  # the current directory is unchanged
    assert config_from_python(cfg_py, echo=None).bucket_order == "outside_in"


def test_mixed_case_keys_become_snake_case(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "cfg.py", returning(
        'dict(entities={"userId": {"numPartitions": 1}}, relations=[{"name": "r", "lhs": "userId", '
        '"rhs": "userId", "allNegs": True}], dimension=8, entityPath="data", edgePaths=["e"], '
        'checkpointPath="model", numEpochs=3)'))
    cfg = config_from_python(cfg_py, echo=None)
    assert cfg.num_epochs == 3 and cfg.relations[0].all_negs and cfg.entities["userId"].num_partitions == 1


def test_the_configs_own_output_cannot_corrupt_the_result(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "noisy.py", f"""\
        import sys
        print('{{"entities": "not this"}}')
        def get_torchbiggraph_config():
            print("loading config", flush=True)
            print("a warning", file=sys.stderr)
            sys.stdout.write("no newline at the end")
            return {MINIMAL}
        """)
    echoed: list[str] = []
    assert load_python_config(cfg_py, echo=echoed.append)["dimension"] == 8
    assert "loading config" in "".join(echoed) and "a warning" in "".join(echoed)
    done = pbgio("config", "from-py", str(cfg_py), "-o", "-")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entities"] == {"e": {"num_partitions": 1, "featurized": False, "dimension": None}}
    assert "loading config" in done.stderr and "loading config" not in done.stdout


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    err = problem(tmp_path / "absent.py")
    assert err.issues[0].rule == "config-unreadable" and "found nothing" in err.issues[0].message
    assert "a directory" in problem(tmp_path).issues[0].message


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "broken.py", "def get_torchbiggraph_config():\n    x = 1\n    return dict(a=\n")
    message = problem(cfg_py).issues[0].message
    assert "syntax error at line 3" in message, message


def test_no_function_mentions_the_older_names(tmp_path: Path) -> None:
    old = write(tmp_path / "old.py", "def get_conf():\n    return {}\n")
    message = problem(old).issues[0].message
    assert "get_torchbiggraph_config()" in message and "get_conf()" in message and "rename" in message
    older = write(tmp_path / "older.py", "def get_torchbiggraph_conf():\n    return {}\n")
    assert "get_torchbiggraph_conf()" in problem(older).issues[0].message
    none = write(tmp_path / "none.py", "CONFIG = {}\n")
    message = problem(none).issues[0].message
    assert "found none" in message and "rename" not in message
    assert "to be a function, found int" in problem(write(tmp_path / "n.py", "get_torchbiggraph_config = 3\n")
                                                     ).issues[0].message


def test_function_raising_shows_type_and_message_not_a_traceback(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "raises.py", """\
        def get_torchbiggraph_config():
            dims = {"small": 8}
            return dict(dimension=dims["large"])
        """)
    message = problem(cfg_py).issues[0].message
    assert message == "get_torchbiggraph_config() raised KeyError: 'large' at line 3"
    module_level = write(tmp_path / "module.py", "import no_such_module_here\n")
    message = problem(module_level).issues[0].message
    assert "ModuleNotFoundError: No module named 'no_such_module_here' at line 1" in message
    original = write(tmp_path / "tbg.py", "from torchbiggraph.config import BucketOrder\n")
    if subprocess.run([sys.executable, "-c", "import torchbiggraph"], capture_output=True).returncode:
        assert "install it" in problem(original).issues[0].message
    exits = write(tmp_path / "exits.py", "import sys\ndef get_torchbiggraph_config():\n    sys.exit(3)\n")
    assert "raised SystemExit: 3" in problem(exits).issues[0].message
    dies = write(tmp_path / "dies.py", "import os\nos._exit(4)\n")
    assert "exited with status 4" in problem(dies).issues[0].message
    for err in (problem(cfg_py), problem(module_level)):
        assert "Traceback" not in str(err)


def test_return_value_not_a_dict(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "list.py", returning("[('dimension', 8)]"))
    assert problem(cfg_py).issues[0].message == "expected get_torchbiggraph_config() to return a dict, found list"


def test_non_json_value_names_its_key_path(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "nonjson.py", "import pathlib\n" + returning(
        'dict(relations=[{"name": "r"}, {"name": "s", "weight": {1.0, 2.0}}], entity_path=pathlib.Path("d"))'))
    err = problem(cfg_py)
    assert err.issues[0].rule == "config-schema" and err.issues[0].dataset == "relations[1].weight"
    assert "found set" in err.issues[0].message
    keys = write(tmp_path / "keys.py", returning('{"entities": {1: {"num_partitions": 1}}}'))
    assert problem(keys).issues[0].dataset == "entities"


def test_timeout_stops_the_file(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "slow.py", "import time\ndef get_torchbiggraph_config():\n    time.sleep(600)\n")
    start = time.monotonic()
    message = problem(cfg_py, timeout=0.5).issues[0].message
    assert time.monotonic() - start < 600  # a logical bound: the file's sleep did not run to its end
    assert "within 0.5 s" in message and "stopped" in message


def test_cli_errors_exit_one_without_traceback(tmp_path: Path) -> None:
    cfg_py = write(tmp_path / "raises.py", returning("1 / 0"))
    done = pbgio("config", "from-py", str(cfg_py), "-o", str(tmp_path / "out.json"))
    assert done.returncode == 1
    assert "ZeroDivisionError: division by zero" in done.stderr and "[config-unreadable]" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.json").exists()
    assert pbgio("config", "from-py", str(tmp_path / "absent.py"), "-o", "-").returncode == 2


# --------------------------------------------------------------------------- writing JSON


def test_relative_paths_are_rebased_for_the_output_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "configs" / "cfg.py", returning(
        'dict(entities={"e": {"num_partitions": 1}}, relations=[{"name": "r", "lhs": "e", "rhs": "e"}], '
        f'dimension=8, entity_path="data", edge_paths=["data/train", {str(tmp_path / "abs")!r}, "hdfs://h/e"], '
        'checkpoint_path="model", init_path="out/init")'))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    done = pbgio("config", "from-py", "configs/cfg.py", "-o", "out/config.json")
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "out" / "config.json").read_text(encoding="utf-8"))
    assert written["entity_path"] == "../data" and written["checkpoint_path"] == "../model"
    assert written["edge_paths"] == ["../data/train", str(tmp_path / "abs"), "hdfs://h/e"]
    assert written["init_path"] == "init"
    for key in ("entity_path", "edge_paths[0]", "checkpoint_path", "init_path"):
        assert f"  {key}: " in done.stderr
    assert "edge_paths[1]" not in done.stderr and "wrote out/config.json" in done.stderr
    # pbgio resolves them against the JSON file's directory: the same directories as the original.
    out = tmp_path / "out"
    assert local_path(written["entity_path"], out).resolve() == (tmp_path / "data").resolve()
    assert local_path(written["edge_paths"][0], out).resolve() == (tmp_path / "data/train").resolve()
    assert ConfigSchema.model_validate(written).to_json() + "\n" == (out / "config.json").read_text()


def test_rebase_in_the_same_directory_changes_nothing(fb15k: Path) -> None:
    cfg = config_from_python(fb15k, echo=None)
    same, changed = rebase_paths(cfg, fb15k.parent, fb15k.parent)
    assert same == cfg and changed == {}


def test_existing_output_needs_force(fb15k: Path, tmp_path: Path) -> None:
    out = tmp_path / "config.json"
    out.write_text("{}")
    done = pbgio("config", "from-py", str(fb15k), "-o", str(out))
    assert done.returncode == 2 and "--force" in done.stderr
    assert out.read_text() == "{}"
    done = pbgio("config", "from-py", str(fb15k), "-o", str(out), "--force", "-p", "num_epochs=2")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["num_epochs"] == 2
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    assert pbgio("config", "from-py", str(fb15k), "-o", str(tmp_path)).returncode == 2  # a directory
    assert pbgio("config", "from-py", str(fb15k), "-o", str(tmp_path / "no" / "c.json")).returncode == 2


def test_stdout_output_keeps_paths_and_matches_the_schema_dump(fb15k: Path) -> None:
    done = pbgio("config", "from-py", str(fb15k), "-o", "-", "-p", "edge_paths=x,y")
    assert done.returncode == 0, done.stderr
    assert done.stdout == config_from_python(fb15k, ["edge_paths=x,y"], echo=None).to_json() + "\n"
    assert json.loads(done.stdout)["entity_path"] == "data/FB15k"
    assert "wrote" not in done.stderr


def test_pbgio_help_does_not_import_the_module() -> None:
    code = "import sys\nfrom pbgio.cli.commands import app\nassert 'pbgio.python_config' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- pbgtrain


@pytest.fixture
def tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An example layout under the current directory and a .py config naming it relative to it."""
    build_example(tmp_path / "example", num_edges=300)
    monkeypatch.chdir(tmp_path)
    return write(tmp_path / "configs" / "tiny.py", """\
        def get_torchbiggraph_config():
            return dict(
                entity_path="example/entities", edge_paths=["example/edges/train"],
                checkpoint_path="example/model_py",
                entities={"user": {"num_partitions": 2}, "item": {"num_partitions": 1}},
                relations=[{"name": "follows", "lhs": "user", "rhs": "user", "operator": "translation"},
                           {"name": "likes", "lhs": "user", "rhs": "item", "operator": "diagonal"}],
                dimension=8, comparator="dot", loss_fn="softmax", num_epochs=3, batch_size=100,
                eval_fraction=0)
        """)


def test_load_run_config_resolves_a_py_config_against_the_current_directory(tiny_run: Path) -> None:
    run = load_run_config(tiny_run, ["num_epochs=1", "edge_paths=example/edges/train,example/edges/test"])
    assert run.config.num_epochs == 1 and run.source == str(tiny_run)
    assert run.entity_path == Path.cwd() / "example/entities"
    assert run.edge_paths[1] == Path.cwd() / "example/edges/test"
    assert load_run_config(tiny_run, base=Path("/data")).checkpoint_path == Path("/data/example/model_py")


def test_pbgtrain_fit_and_eval_a_py_config(tiny_run: Path) -> None:
    done = pbgtrain("fit", str(tiny_run), "-p", "num_epochs=1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "committed checkpoint version 1" in done.stdout
    checkpoint = Path("example/model_py")
    assert (checkpoint / "checkpoint_version.txt").read_text().strip() == "1"
    assert json.loads((checkpoint / "config.json").read_text())["num_epochs"] == 1
    done = pbgtrain("eval", str(tiny_run), "--edges", "example/edges/test", "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == 1
    done = pbgtrain("config", str(tiny_run), "-p", "relations.1.operator=linear")
    assert json.loads(done.stdout)["relations"][1]["operator"] == "linear"


def test_pbgtrain_fit_validates_the_layout_of_a_py_config(tiny_run: Path) -> None:
    done = pbgtrain("fit", str(tiny_run), "-p", "entity_path=nowhere", "--no-progress")
    assert done.returncode == 1
    assert str(tiny_run) in done.stderr and "path-missing" in done.stderr and "nowhere" in done.stderr
    assert not Path("example/model_py").exists()
    done = pbgtrain("fit", str(tiny_run), "-p", "numEpochs=1")
    assert done.returncode == 1 and "did you mean 'num_epochs'" in done.stderr


@pytest.mark.parametrize(("written", "found"), [
    ('{"error": {"kind": "call"}}', "field 'message': expected str, found nothing"),
    ('{"confi": {}}', "found a dict with the keys ['confi']"),
    ("not json", "found unreadable bytes (JSONDecodeError"),
])
def test_a_file_that_writes_over_its_answer_is_a_config_error(tmp_path: Path, written: str, found: str) -> None:
    """The file runs with its answer's path in sys.argv and may write over it (the guided fuzzer's
    config-py target: tests/fuzz_inputs/config-py)."""
    cfg = tmp_path / "config.py"
    cfg.write_text(textwrap.dedent(f"""
        import os, sys
        with open(sys.argv[2], "w") as f:
            f.write({written!r})
        os._exit(0)
    """))
    with pytest.raises(ConfigError, match="did the file write over its answer") as info:
        load_python_config(cfg, echo=None)
    assert found in str(info.value)
    assert str(cfg) in str(info.value) and "[config-unreadable]" in str(info.value)
