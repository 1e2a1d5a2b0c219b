"""Redaction of event data and projected state (pure; no I/O except reading a config file).

Two levels:

* **Always** (every output of the CLI and the web viewer, with or without --redact): any
  value under a key whose name contains a secret word ("api_key", "token", "secret",
  "password", "authorization", …, compared case-insensitively with `_`/`-`/`.` removed) is
  masked at any depth, in any event, and substrings that look like credentials ("sk-…",
  "AIza…", "Bearer …", JWTs, "api_key=…") are masked inside every string.
* **Full** (`--redact`, `?redact=1`, or a config that turns it on): additionally the
  configured fields — tool arguments and results by key name (or all of them), transcript
  text (conversation.message, .message_cut), settings values — and resumption handles (replaced by a short
  fingerprint, so the timeline still shows which handle a session resumed from) — and
  personal data inside the free text that stays (phone numbers, email addresses, card
  numbers, IBANs, street addresses in argument and result values, failure messages,
  anomaly details; `pii.py`), each finding replaced by "[REDACTED:kind]". It fails
  closed: a preview of arguments kept as JSON text, a row that cannot be read, a type or
  schema version this code does not know, and a field it does not know are masked whole,
  since nothing says which of their parts are transcripts or personal data.

A text too long to scan for personal data (over `pii.SCAN_MAX` characters) is masked whole.
A masked value becomes the string "[REDACTED]"; containers keep their shape (a dict stays a
dict, with its leaves masked), so a redacted event still decodes and folds.

rules.py: what is always secret; config.py: what full redaction covers; redactor.py: the
Redactor that applies both.
"""

from .config import DEFAULT_REDACT_KEYS, RedactionConfig, load_config
from .redactor import Redactor
from .rules import ALWAYS_SECRET_KEY_PARTS, ALWAYS_SECRET_PATTERNS, MASK

__all__ = ["ALWAYS_SECRET_KEY_PARTS", "ALWAYS_SECRET_PATTERNS", "DEFAULT_REDACT_KEYS", "MASK",
           "RedactionConfig", "Redactor", "load_config"]
