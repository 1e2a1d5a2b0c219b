"""Numbers and email addresses as a transcript writes them, turned into their written form
before detection (pure).

A voice call's transcript says "four one five, five five five, two six seven one" and "anna
dot berg at firma dot de"; the detectors know "415 555 2671" and "anna.berg@firma.de".
`normalise` rewrites runs of spoken digits (English, German, French, Spanish, Italian: the
languages the bot speaks) and spoken email addresses, and keeps a map back to the original
text, so a finding in the written form masks exactly the spoken words it came from.

A run is rewritten only when it spells at least five digits with at least three number words:
"one or two items" and "Sept 9, 2001" stay as they are.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

_UNITS: dict[str, str] = {}
for _digit, _words in enumerate((
        "zero oh null zéro zero cero", "one eins un uno", "two zwei zwo deux dos due",
        "three drei trois tres tre", "four vier quatre cuatro quattro",
        "five fünf fuenf cinq cinco cinque", "six sechs seis sei",
        "seven sieben sept siete sette", "eight acht huit ocho otto",
        "nine neun neuf nueve nove")):
    for _w in _words.split():
        _UNITS[_w] = str(_digit)
_TEENS = {w: str(10 + i) for i, w in enumerate(
    "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: str(20 + 10 * i) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())}
_REPEAT = {"double": 2, "triple": 3, "doppel": 2, "doppelte": 2}
_PLUS = {"plus"}
_SEPARATORS = {",": " ", "-": "-", "–": "-", "dash": "-", "bindestrich": "-", "tiret": "-",
               "guion": "-", "guión": "-", "trattino": "-"}
_DOT = r"(?:dot|punkt|point|punto)"
_AT = r"(?:at|@|ät|arobase|arroba|chiocciola)"
_TOKEN = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*|\d+|[,–-]|\s+|.", re.UNICODE)
_MIN_DIGITS = 5
# Fewer number words are a date or an amount said in passing ("Sept 9, 2001": "sept" is
# French for seven).
_MIN_WORDS = 3


@dataclass(frozen=True)
class Normalised:
    """The written form of a text and how to map a span of it back to the original."""

    text: str
    # (start in `text`, start in the original, changed?) of each piece, in order
    _starts: tuple[int, ...]
    _pieces: tuple[tuple[int, int, int, int, bool], ...]

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span covering the written form's [start, end)."""
        a = self._pieces[max(0, bisect_right(self._starts, start) - 1)]
        b = self._pieces[max(0, bisect_right(self._starts, max(start, end - 1)) - 1)]
        o_start = a[2] + (start - a[0]) if not a[4] else a[2]
        o_end = b[2] + (end - b[0]) if not b[4] else b[3]
        return o_start, o_end


def _word_digits(word: str, prev: str | None) -> str | None:
    """The digits a spoken word stands for (None: not a number word). `prev`: the digits
    of the word before, for "hundred"."""
    parts = word.lower().split("-")
    if len(parts) == 2 and parts[0] in _TENS and parts[1] in _UNITS and _UNITS[parts[1]] != "0":
        return _TENS[parts[0]][0] + _UNITS[parts[1]]
    if len(parts) != 1:
        return None
    w = parts[0]
    if w in _UNITS:
        return _UNITS[w]
    if w in _TEENS:
        return _TEENS[w]
    if w in _TENS:
        return _TENS[w]
    if w == "hundred" and prev is not None and len(prev) == 1:
        return "00"
    return None


def _digit_runs(text: str) -> list[tuple[int, int, str]]:
    """(start, end, written form) of each run of spoken digits worth rewriting."""
    tokens = [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(text)]
    runs: list[tuple[int, int, str]] = []
    i = 0
    while i < len(tokens):
        start, _end, tok = tokens[i]
        if not (_word_digits(tok, None) or tok.lower() in _REPEAT or tok.lower() in _PLUS
                or tok.isdigit()):
            i += 1
            continue
        out: list[str] = []
        words = 0
        last_end = start
        repeat = 1
        j = i
        pending_sep = ""
        prev: str | None = None
        while j < len(tokens):
            s, e, t = tokens[j]
            low = t.lower()
            if t.isspace():
                j += 1
                continue
            if low in _SEPARATORS:
                pending_sep = _SEPARATORS[low] if out else ""
                j += 1
                continue
            if low in _PLUS and not out:
                out.append("+")
                last_end, j = e, j + 1
                continue
            if low in _REPEAT:
                repeat = _REPEAT[low]
                j += 1
                continue
            digits = t if t.isdigit() else _word_digits(t, prev)
            if digits is None:
                break
            if not t.isdigit():
                words += 1
            if pending_sep:
                out.append(pending_sep)
                pending_sep = ""
            if digits == "00" and low == "hundred":
                out.append("00")
            else:
                out.append(digits * repeat)
            repeat, prev, last_end, j = 1, digits, e, j + 1
        written = "".join(out)
        if words >= _MIN_WORDS and sum(c.isdigit() for c in written) >= _MIN_DIGITS:
            runs.append((start, last_end, written))
            i = j
        else:
            i = max(j, i + 1)
    return runs


_SPOKEN_EMAIL = re.compile(
    rf"(?<![\w.])((?!{_AT}\b)[\w+-]+(?:\s+{_DOT}\s+(?!{_AT}\b)[\w+-]+)*)"
    rf"\s+{_AT}\s+([\w-]+(?:\s+{_DOT}\s+[\w-]+)*\s+{_DOT}\s+[^\W\d_]{{2,12}})"
    rf"(?!\s+{_AT}\s)(?![\w])", re.IGNORECASE)
_DOT_WORD = re.compile(rf"\s+{_DOT}\s+", re.IGNORECASE)


def _email_runs(text: str) -> list[tuple[int, int, str]]:
    out = []
    for m in _SPOKEN_EMAIL.finditer(text):
        local = _DOT_WORD.sub(".", m.group(1))
        domain = _DOT_WORD.sub(".", m.group(2))
        out.append((m.start(), m.end(), f"{local}@{domain}"))
    return out


def normalise(text: str) -> Normalised | None:
    """The written form of `text`, or None when nothing in it is spoken digits or a spoken
    email address (the text is scanned as it is)."""
    runs = sorted(_email_runs(text) + _digit_runs(text))
    if not runs:
        return None
    pieces: list[tuple[int, int, int, int, bool]] = []
    parts: list[str] = []
    at, n = 0, 0
    for start, end, written in runs:
        if start < at:  # overlaps a rewrite already made (an email with digits in it)
            continue
        if start > at:
            pieces.append((n, n + start - at, at, start, False))
            parts.append(text[at:start])
            n += start - at
        pieces.append((n, n + len(written), start, end, True))
        parts.append(written)
        n += len(written)
        at = end
    pieces.append((n, n + len(text) - at, at, len(text), False))
    parts.append(text[at:])
    return Normalised("".join(parts), tuple(p[0] for p in pieces), tuple(pieces))
