"""Issue 54, the leaks and the terminal. Names a layout ships are data, never terminal control: OSC
escape sequences (the clipboard, a hyperlink, the window title) and bidi overrides are shown escaped
by ``pbgio names``, ``pbgtrain predict``, ``pbgio neighbors``, ``pbgio info`` and in errors; rich
markup in a name is shown as it is (``info``, ``eval --per-relation``); ``--json`` keeps names
exact. No message shows a secret a URL carries (user info holding ``@``, presigned URLs'
signatures), nor a storage library's raw traceback.

Every command runs for real (tests/cli.py) on a small layout with a random checkpoint, written once
for the module (pbgio.testing); the storage errors come from botocore itself (no request is sent:
botocore refuses the bucket name before it signs anything)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import typer

from pbgio.config import parse_config
from pbgio.console import exit_codes, print_error, redact
from pbgio.testing import small_valid_layout, write_layout
from tests.cli import pbgio, pbgtrain

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"  # OSC 52: puts "evil" on the clipboard
HYPERLINK = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"  # OSC 8: a link the name hides
TITLE = "\x1b]0;pwned\x07"  # OSC 0: the window title
REVERSED = "abc\u202edcba"  # a right-to-left override: the name reads differently than it is
HOSTILE = [CLIPBOARD, HYPERLINK, TITLE, REVERSED]
CLOSING_TAG, BOLD = "[/]", "[bold]x"  # rich markup: a MarkupError, and text made bold
CONTROL = ("\x1b", "\x07", "\u202e")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A layout whose 'user' names hold OSC sequences and a bidi override, and whose relations are
    named as rich markup (``[/]``, ``[bold]x``); its checkpoint is random (version 1)."""
    layout = small_valid_layout(featurized=False)
    raw = layout.config.to_dict()
    raw["relations"][0]["name"], raw["relations"][1]["name"] = CLOSING_TAG, BOLD
    layout.config = parse_config(raw, "hostile")
    layout.relation_names = [CLOSING_TAG, BOLD]
    layout.names[("user", 0)][:len(HOSTILE)] = HOSTILE
    return write_layout(tmp_path_factory.mktemp("hostile"), layout)


def assert_no_control(*texts: str) -> None:
    for text in texts:
        assert not any(c in text for c in CONTROL), repr(text)


SHOWN = {CLIPBOARD: "\\x1b]52;c;ZXZpbA==\\x07", TITLE: "\\x1b]0;pwned\\x07", REVERSED: "abc\\u202edcba",
         HYPERLINK: "\\x1b]8;;https://evil.example/\\x1b\\click me\\x1b]8;;\\x1b\\"}


def escaped(name: str) -> str:
    """How human output shows a hostile name: its control characters escaped, the rest as it is."""
    return SHOWN[name]


# --------------------------------------------------------------------------- names are data


def test_printable_escapes_c0_c1_del_and_bidi_controls_and_keeps_what_it_is_told() -> None:
    from pbgio.console import printable

    assert printable("a\x00b\x1b[31mc\x7fd\x9be\u202af\u2066g\u2069") == \
        "a\\x00b\\x1b[31mc\\x7fd\\x9be\\u202af\\u2066g\\u2069"
    assert printable("tab\tand\nline") == "tab\\tand\\nline"
    assert printable("two\nlines\x1b", keep="\n") == "two\nlines\\x1b"
    plain = "dog.n.01 école 狗 [bold]"
    assert printable(plain) is plain


def test_pbgio_names_shows_control_characters_escaped(hostile: Path) -> None:
    done = pbgio("names", str(hostile), "--type", "user")
    assert done.returncode == 0, done.stderr
    assert_no_control(done.stdout, done.stderr)
    assert done.stdout.splitlines()[:len(HOSTILE)] == [escaped(n) for n in HOSTILE]
    assert "\\x1b]52;c;ZXZpbA==\\x07" in done.stdout
    relations = pbgio("names", str(hostile), "--relations")
    assert relations.returncode == 0 and relations.stdout.splitlines() == [CLOSING_TAG, BOLD]


def test_pbgio_neighbors_shows_names_escaped_and_json_keeps_them_exact(hostile: Path) -> None:
    done = pbgio("neighbors", str(hostile), "--type", "user", CLIPBOARD, "-k", "8")
    assert done.returncode == 0, done.stderr
    assert_no_control(done.stdout, done.stderr)
    for name in HOSTILE:
        assert escaped(name) in done.stdout
    assert done.stdout.splitlines()[1].startswith(escaped(CLIPBOARD) + " ")  # the query column too
    exact = pbgio("neighbors", str(hostile), "--type", "user", CLIPBOARD, "-k", "8", "--json")
    assert exact.returncode == 0, exact.stderr
    found = json.loads(exact.stdout)[0]
    assert found["query"] == CLIPBOARD and set(HOSTILE[1:]) <= {n["name"] for n in found["neighbors"]}


def test_pbgtrain_predict_top_k_and_triple_show_names_escaped(hostile: Path) -> None:
    top = pbgtrain("predict", str(hostile), "--lhs", CLIPBOARD, "--rel", CLOSING_TAG, "-k", "9")
    assert top.returncode == 0, top.stderr
    assert_no_control(top.stdout, top.stderr)
    for name in HOSTILE:
        assert escaped(name) in top.stdout + top.stderr
    assert f"({escaped(CLIPBOARD)}, {CLOSING_TAG}, ?)" in top.stderr  # the query line, markup shown as is
    triple = pbgtrain("predict", str(hostile), "--lhs", HYPERLINK, "--rel", CLOSING_TAG, "--rhs", TITLE)
    assert triple.returncode == 0, triple.stderr
    assert_no_control(triple.stdout, triple.stderr)
    assert f"({escaped(HYPERLINK)}, {CLOSING_TAG}, {escaped(TITLE)}) ranked on both sides" in triple.stderr
    exact = pbgtrain("predict", str(hostile), "--lhs", CLIPBOARD, "--rel", CLOSING_TAG, "-k", "9", "--json")
    assert exact.returncode == 0, exact.stderr
    result = json.loads(exact.stdout)
    assert result["query"]["lhs"] == CLIPBOARD and set(HOSTILE) <= {p["name"] for p in result["predictions"]}


def test_pbgtrain_predict_tsv_outputs_show_names_escaped(hostile: Path) -> None:
    triples = hostile.parent / "triples.tsv"
    triples.write_text(f"{CLIPBOARD}\t{CLOSING_TAG}\t{TITLE}\n{HYPERLINK}\t{CLOSING_TAG}\t{REVERSED}\n")
    scored = pbgtrain("predict", str(hostile), "--triples", str(triples))
    assert scored.returncode == 0, scored.stderr
    assert_no_control(scored.stdout, scored.stderr)
    assert [line.split("\t")[:3] for line in scored.stdout.splitlines()[1:]] == [
        [escaped(CLIPBOARD), CLOSING_TAG, escaped(TITLE)], [escaped(HYPERLINK), CLOSING_TAG, escaped(REVERSED)]]
    queries = hostile.parent / "queries.tsv"
    queries.write_text(f"{TITLE}\t{CLOSING_TAG}\t\n")
    ranked = pbgtrain("predict", str(hostile), "--queries", str(queries), "-k", "9")
    assert ranked.returncode == 0, ranked.stderr
    assert_no_control(ranked.stdout, ranked.stderr)
    assert {line.split("\t")[4] for line in ranked.stdout.splitlines()[1:]} >= {escaped(n) for n in HOSTILE}


def test_pbgio_info_shows_relations_named_as_markup_as_they_are(hostile: Path) -> None:
    done = pbgio("info", str(hostile))  # "[/]" made rich raise MarkupError: a traceback
    assert done.returncode == 0, done.stderr
    assert f"│ 0 │ {CLOSING_TAG} " in done.stdout and f"│ 1 │ {BOLD} " in done.stdout
    as_json = json.loads(pbgio("info", str(hostile), "--json").stdout)
    assert [r["name"] for r in as_json["relations"]] == [CLOSING_TAG, BOLD]


def test_pbgtrain_eval_per_relation_shows_relations_named_as_markup_as_they_are(hostile: Path) -> None:
    done = pbgtrain("eval", str(hostile), "--per-relation", "--no-progress")  # a MarkupError traceback before
    assert done.returncode == 0, done.stderr
    assert f"│ {CLOSING_TAG} " in done.stdout and f"│ {BOLD} " in done.stdout


def test_pbgio_info_shows_dynamic_relation_names_escaped(tmp_path: Path) -> None:
    layout = small_valid_layout(featurized=False, dynamic=True)
    layout.relation_names = [CLOSING_TAG, BOLD, TITLE]
    config = write_layout(tmp_path, layout)
    done = pbgio("info", str(config))
    assert done.returncode == 0, done.stderr
    assert_no_control(done.stdout, done.stderr)
    assert f"dynamic relation types: 3: {CLOSING_TAG}, {BOLD}, {escaped(TITLE)}" in done.stdout


def test_errors_show_names_escaped_and_keep_their_lines(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = pbgtrain("predict", str(hostile), "--lhs", "user-0-4", "--rel", "likes")  # lists the relations
    assert unknown.returncode == 1
    assert CLOSING_TAG in unknown.stderr and BOLD in unknown.stderr
    print_error(f"first line names {TITLE}\nsecond line {HYPERLINK}")
    err = capsys.readouterr().err
    assert_no_control(err)
    assert err.splitlines() == [f"error: first line names {escaped(TITLE)}", f"second line {escaped(HYPERLINK)}"]


# --------------------------------------------------------------------------- no secret in any message


@pytest.mark.parametrize(("url", "secrets", "shown"), [
    ("s3://AKIAQX7:s3Cr@Tz9@bucket/x", ["AKIAQX7", "s3Cr", "Tz9"], "s3://***@bucket/x"),
    ("s3://AKIA:wJal/rXUt@bucket/x", ["AKIA", "wJal", "rXUt"], "s3://***@bucket/x"),
    ("gs://b/o.h5?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=svc%40proj.iam%2F20260101&X-Goog-Date="
     "20260101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=5f2e9a0c77d1",
     ["5f2e9a0c77d1", "svc%40proj"], "X-Goog-Signature=***"),
    ("https://storage.googleapis.com/b/o?GoogleAccessId=svc%40p.iam&Expires=1&Signature=c2lnbmF0dXJl",
     ["svc%40p", "c2lnbmF0dXJl"], "GoogleAccessId=***&Expires=1&Signature=***"),
    ("https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7%2F20260101"
     "&X-Amz-Security-Token=FwoGZXIvYXdz&X-Amz-Signature=fe5f80f77d5f",
     ["AKIAIOSFODNN7", "FwoGZXIvYXdz", "fe5f80f77d5f"], "X-Amz-Signature=***"),
    ("abfs://c@acct.dfs.core.windows.net/g?sv=2024-01-01&sp=r&sig=c2FzIHNpZw%3D", ["c2FzIHNpZw"], "sig=***"),
    ("https://h/x?token=t0k3n&access_token=a55&key=k3y&secret=s3cr3t&password=pa55", ["t0k3n", "a55", "k3y", "s3cr3t"],
     "token=***&access_token=***&key=***&secret=***&password=***"),
])
def test_redact_hides_every_secret_a_url_carries(url: str, secrets: list[str], shown: str) -> None:
    message = redact(f"error: {url}: access denied")
    assert shown in message and message.endswith(": access denied")
    for secret in secrets:
        assert secret not in message, message


def test_redact_leaves_urls_without_secrets_as_they_are() -> None:
    for text in ("hdfs://namenode:8020/data/a@b/edges", "s3://bucket/run@2/model", "/srv/graph/x?y=1",
                 "memory://pbg/run/config.json", "gs://bucket/o?generation=12"):
        assert redact(text) == text


@pytest.fixture
def offline_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 clients with credentials and an endpoint that answers nothing, remote storage allowed:
    botocore refuses a bad bucket name before it sends a request."""
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                        "PBG_ALLOW_REMOTE": "*"}.items():
        monkeypatch.setenv(name, value)


def assert_one_line_without_secret(done: subprocess.CompletedProcess[str],
                                   secrets: tuple[str, ...] = ("AKIAQX7", "s3Cr", "Tz9")) -> None:
    assert done.returncode in (1, 2), done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    for secret in secrets:
        assert secret.lower() not in (done.stdout + done.stderr).lower(), done.stderr


SECRET_URL = "s3://AKIAQX7:s3Cr@Tz9@bucket/x"  # botocore: 'Invalid bucket name "AKIAQX7:s3Cr@Tz9@bucket"'


@pytest.mark.slow  # fit's start (torch) and s3fs's: about 3 s
@pytest.mark.usefixtures("offline_s3")
def test_fit_on_a_bucket_name_botocore_refuses_is_one_line_without_the_secret(hostile: Path) -> None:
    assert_one_line_without_secret(pbgtrain("fit", str(hostile), "-p", f"entity_path={SECRET_URL}", "--no-progress"))


@pytest.mark.usefixtures("offline_s3")
def test_a_bucket_name_botocore_refuses_is_one_line_without_the_secret(hostile: Path) -> None:
    url = SECRET_URL
    assert_one_line_without_secret(pbgio("validate", str(hostile), "-p", f"entity_path={url}"))
    assert_one_line_without_secret(pbgio("info", url))
    slash = "s3://AKIAQX7:wJal/rXUt@bucket/x"  # a secret holding "/": botocore sees the bucket "AKIAQX7:wJal"
    assert_one_line_without_secret(pbgio("validate", slash), ("AKIAQX7", "wJal", "rXUt"))


def test_exit_codes_turn_a_storage_library_exception_into_one_redacted_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("botocore")
    from botocore.handlers import validate_bucket_name  # type: ignore[import-untyped]

    with pytest.raises(typer.Exit) as stop, exit_codes():
        validate_bucket_name({"Bucket": "AKIAQX7:s3Cr@Tz9@bucket"})  # raised in botocore's code, unwrapped
    assert stop.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: botocore: ParamValidationError: ") and err.count("\n") == 1, err
    assert '"***@bucket"' in err and "s3Cr" not in err and "AKIAQX7" not in err
    import fsspec

    with pytest.raises(typer.Exit) as stop, exit_codes():
        fsspec.get_filesystem_class("no-such-scheme-pbg")  # a ValueError raised in fsspec's code
    assert stop.value.exit_code == 1
    assert capsys.readouterr().err.startswith("error: fsspec: ValueError: Protocol not known: no-such-scheme-pbg")
    with pytest.raises(ValueError, match="of pbg's own"), exit_codes():  # not a storage library's: kept as it is
        raise ValueError("a bug of pbg's own")
