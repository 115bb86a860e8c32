"""What a message may show of a text it did not write: secrets redacted, control characters escaped
(a base module of pbgio, the standard library only, so that the errors and the consoles both use it).

- :func:`redact`: the secrets URLs carry (user info, presigned signatures and credentials) hidden,
  for every path or URL a message shows;
- :func:`secrets_in` and :func:`redact_foreign`: the same for another library's message (a storage
  library quoting a bucket name);
- :func:`printable`: a name read from a file, safe to write to a terminal (docs/security.md).

:mod:`pbgio.console` re-exports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_URL_RE = re.compile(r"(?<![a-zA-Z0-9+.-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]+://)(?P<rest>[^\s'\"<>]*)")
_SECRET_PARAMS = (
    "sig", "signature", "sas", "sastoken",  # Azure SAS, generic signatures
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",  # S3 presigned URLs
    "x-goog-signature", "x-goog-credential", "googleaccessid",  # GCS signed URLs (V4 and V2)
    "token", "access_token", "refresh_token", "id_token", "auth", "secret", "client_secret", "password",
    "passwd", "key", "api_key", "apikey")
_SECRET_PARAM_RE = re.compile(
    rf"(?P<key>[?&#;](?:{'|'.join(re.escape(p) for p in _SECRET_PARAMS)})=)(?P<value>[^&#;\s'\"]*)", re.IGNORECASE)
_UNSAFE_CHARS = "\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_UNSAFE_RE: dict[str, re.Pattern[str]] = {"": re.compile(f"[{_UNSAFE_CHARS}]")}
_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_TOKEN_WITH_AT_RE = re.compile(r"[^\s'\"<>()\[\]{},;/]+@")
REDACTED = "***"
"""What a secret is replaced with in messages."""


def _userinfo_end(rest: str) -> int:
    """Where the user info of a URL's part after ``scheme://`` ends (the index of its last ``@``), or -1.

    The user info runs to the last ``@`` of the authority (a secret may hold ``@``). An authority
    that reads ``user:secret`` (not ``host:port``) followed by an ``@`` later in the path is user
    info too: a secret holding ``/`` (as AWS secret keys do) ends the authority early."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        return authority.rindex("@")
    if ":" in authority and not authority.rsplit(":", 1)[1].isdigit() and not authority.startswith("["):  # not IPv6
        before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
        return before_query.rfind("@")
    return -1


def redact(text: str) -> str:
    """``text`` with the secrets URLs carry replaced by ``***``: their user info (everything up to
    the last ``@`` of the authority) and the signatures and credentials of presigned URLs (S3's
    ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``; GCS's ``X-Goog-Signature``,
    ``X-Goog-Credential``, ``GoogleAccessId``, ``Signature``; Azure SAS's ``sig``; ``token``, ``key``,
    ``secret``, ``password`` …). Every path or URL a message shows goes through it (the consoles of
    :func:`console` apply it to all they print).

    >>> redact("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/graph")
    's3://***@bucket/graph'
    >>> redact("s3://KEY:SEC@RET@bucket/x, s3://KEY:wJal/rXUt@bucket/y and hdfs://nn:8020/a@b")
    's3://***@bucket/x, s3://***@bucket/y and hdfs://nn:8020/a@b'
    >>> redact("gs://b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=svc%40p&X-Goog-Signature=9f3a: gone")
    'gs://b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=***&X-Goog-Signature=***: gone'
    """
    if "://" in text:
        def hide_userinfo(m: re.Match[str]) -> str:
            end = _userinfo_end(m["rest"])
            return m[0] if end < 0 else f"{m['scheme']}{REDACTED}{m['rest'][end:]}"

        text = _URL_RE.sub(hide_userinfo, text)
    if "=" in text:  # a colon that ends the value ends the URL in messages ("URL: reason")
        text = _SECRET_PARAM_RE.sub(lambda m: f"{m['key']}{REDACTED}{':' if m['value'].endswith(':') else ''}", text)
    return text


def secrets_in(text: str) -> list[str]:
    """The secrets the URLs of ``text`` carry (what :func:`redact` hides), longest first: their user
    info, its password part and the part before a ``/`` in it (as a storage library may quote them
    without the URL around them, as a bucket name), and the values of secret query parameters.

    >>> secrets_in("-p entity_path=s3://KEY:SEC@RET@bucket/x")
    ['KEY:SEC@RET', 'SEC@RET']
    """
    found: set[str] = set()
    for m in _URL_RE.finditer(text):
        end = _userinfo_end(m["rest"])
        if end < 0:
            continue
        userinfo = m["rest"][:end]
        found.add(userinfo)
        pieces = (userinfo.partition(":")[2], userinfo.split("/")[0])
        found.update(piece for piece in pieces if len(piece) >= 4)
    found.update(m["value"].removesuffix(":") for m in _SECRET_PARAM_RE.finditer(text) if m["value"].strip(":"))
    return sorted(found, key=lambda s: (-len(s), s))


def redact_foreign(text: str, known: Iterable[str] = ()) -> str:
    """:func:`redact` for what another library wrote (a storage library's exception): ``known``
    secrets (:func:`secrets_in` of the URLs involved) removed wherever they appear, whatever their
    case (botocore quotes a bucket name without its URL, s3fs lowers parts of it), and the part
    before the last ``@`` of any word holding one hidden, as user info would be.

    >>> redact_foreign('Invalid bucket name "key:SEC@RET@bucket": must match', known=["KEY:SEC@RET"])
    'Invalid bucket name "***@bucket": must match'
    >>> redact_foreign('Invalid bucket name "AKIA:pw@RET@bucket"')
    'Invalid bucket name "***@bucket"'
    """
    for secret in sorted(set(known), key=len, reverse=True):
        if secret:
            text = re.sub(re.escape(secret), REDACTED, text, flags=re.IGNORECASE)
    text = redact(text)
    return _TOKEN_WITH_AT_RE.sub(lambda m: m[0] if m[0].startswith(REDACTED + "@") else f"{REDACTED}@", text)


def printable(text: str, keep: str = "") -> str:
    """``text`` safe to write to a terminal: every C0 and C1 control character, DEL and the bidi
    embedding, override and isolate controls (U+202A–U+202E, U+2066–U+2069) escaped as ``\\x1b``,
    ``\\u202e``, ``\\n`` … (but those of ``keep``, e.g. ``"\\n"`` for a message of several lines), so
    that a name read from a file is shown as data and never controls the terminal (a title, a
    hyperlink, the clipboard, text shown reversed). Names and relation names go through it in every
    human output; ``--json`` keeps them exact.

    >>> printable("\\x1b]52;c;ZXZpbA==\\x07 a\\tb \\u202eevil")
    '\\\\x1b]52;c;ZXZpbA==\\\\x07 a\\\\tb \\\\u202eevil'
    >>> printable("two\\nlines\\x9b", keep="\\n")
    'two\\nlines\\\\x9b'
    """
    unsafe = _UNSAFE_RE.get(keep)
    if unsafe is None:
        unsafe = _UNSAFE_RE[keep] = re.compile(f"[{_UNSAFE_CHARS}]" if not keep else
                                               f"(?![{re.escape(keep)}])[{_UNSAFE_CHARS}]")
    if unsafe.search(text) is None:
        return text
    return unsafe.sub(lambda m: _escaped(m[0]), text)


def _escaped(char: str) -> str:
    code = ord(char)
    return _SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
