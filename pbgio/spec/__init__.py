"""The declaration of every current (format_version 1) artifact.

Readers, writers, the validator, the docs tables and the JSON Schemas all derive
from the modules in this package; nothing else spells out a name, dtype or rule.
"""

FORMAT_VERSION = 1
FORMAT_VERSION_ATTR = "format_version"
