"""National identifiers and dates of birth inside free text (pure).

Each national number is confirmed by `python-stdnum`'s validator for its country (format and
check digits), so an order id of the same length stays unless its digits also pass. A number
made of digits alone is only taken when it is written the way that number is written (SSN
`123-45-6789`) or when words naming it come shortly before ("SSN", "Steuer-ID", "Aadhaar"):
nine or eleven digits that happen to pass a check are common among order ids. Letters and
digits in a number's own shape (NI numbers, Spanish DNI, Italian codice fiscale, Indian PAN)
are taken without context.

A date is a date of birth when birth words come shortly before it ("born", "DOB",
"geboren", "né le"): a date alone is a booking, an order or a timestamp and stays.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Span = tuple[int, int, str]

# How far before a number its naming words may stand (characters).
_CONTEXT = 48

#: Words that name a national number, in the bot's languages (lower case, matched as words).
ID_WORDS = re.compile(
    r"\b(?:ssn|social security|social insurance|sin|national insurance|ni number|nino|"
    r"national id|id number|identity number|identification number|personal number|"
    r"tax id|tax number|taxpayer|tin|aadhaar|aadhar|uid|pan|bsn|burgerservicenummer|"
    r"steuer-?id|steuer-?identifikationsnummer|identifikationsnummer|idnr|"
    r"sozialversicherungsnummer|rentenversicherungsnummer|versicherungsnummer|"
    r"personalausweis|ausweisnummer|"
    r"num[ée]ro de s[ée]curit[ée] sociale|s[ée]curit[ée] sociale|nir|insee|"
    r"n[úu]mero de identidad|dni|nie|nif|codice fiscale|pesel|personnummer|cpr|cpf|"
    r"hetu|f[øo]dselsnummer|pps)\b", re.IGNORECASE)

BIRTH_WORDS = re.compile(
    r"\b(?:born|birth|birthday|birthdate|dob|d\.o\.b\.?|date of birth|"
    r"geboren|geburtsdatum|geburtstag|geb\.|"
    r"n[ée]e?|date de naissance|naissance|"
    r"nacid[oa]|fecha de nacimiento|nacimiento|nato|nata|data di nascita)(?!\w)",
    re.IGNORECASE)

# A digit run (spaces, dashes, dots or slashes inside) not glued to a letter, a digit or a
# dash-joined id part (`INV-2026-004417` is an invoice, not three numbers).
_DIGITS = re.compile(r"(?<![\w./-])(?<!\w-)\d(?:[ ./-]?\d){6,16}(?![\w]|-\w|[./]\d)")
_SSN_SHAPE = re.compile(r"(?<![\w-])(\d{3})-(\d{2})-(\d{4})(?![\w-])")
# NI number: two prefix letters, six digits (often in pairs), A–D.
_NINO = re.compile(r"(?<![\w-])([A-Za-z]{2})\s?(\d{2})\s?(\d{2})\s?(\d{2})\s?([A-Da-d])(?![\w-])")
_NINO_BAD_FIRST, _NINO_BAD_SECOND = set("DFIQUV"), set("DFIOQUV")
_NINO_BAD_PREFIX = {"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"}
# Letters and digits in an identifier's own shape (checked by stdnum after).
_ALNUM = re.compile(r"(?<![\w-])[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){7,20}(?![\w-])")


def _stdnum(path: str) -> Callable[[str], bool]:
    def valid(number: str) -> bool:
        import importlib

        return importlib.import_module(f"stdnum.{path}").is_valid(number)

    return valid


#: Digit-only national numbers: taken with naming words before them.
DIGIT_IDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("us.ssn", _stdnum("us.ssn")), ("de.idnr", _stdnum("de.idnr")),
    ("fr.nir", _stdnum("fr.nir")), ("in.aadhaar", _stdnum("in_.aadhaar")),
    ("nl.bsn", _stdnum("nl.bsn")), ("ca.sin", _stdnum("ca.sin")),
    ("pl.pesel", _stdnum("pl.pesel")), ("br.cpf", _stdnum("br.cpf")),
    ("se.personnummer", _stdnum("se.personnummer")), ("dk.cpr", _stdnum("dk.cpr")),
    ("no.fodselsnummer", _stdnum("no.fodselsnummer")), ("ch.ssn", _stdnum("ch.ssn")),
    ("at.vnr", _stdnum("at.vnr")), ("be.nn", _stdnum("be.nn")),
)
#: National numbers with letters in a fixed place: taken without naming words.
SHAPED_IDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("es.dni", _stdnum("es.dni")), ("es.nie", _stdnum("es.nie")),
    ("it.codicefiscale", _stdnum("it.codicefiscale")), ("in.pan", _stdnum("in_.pan")),
    ("fi.hetu", _stdnum("fi.hetu")), ("ie.pps", _stdnum("ie.pps")),
)


def _named_before(text: str, start: int, words: re.Pattern[str]) -> bool:
    return words.search(text[max(0, start - _CONTEXT):start]) is not None


def _nino_ok(m: re.Match[str]) -> bool:
    prefix = m.group(1).upper()
    return (prefix[0] not in _NINO_BAD_FIRST and prefix[1] not in _NINO_BAD_SECOND
            and prefix not in _NINO_BAD_PREFIX)


def national_ids(text: str) -> list[Span]:
    """(start, end, "national_id") of each national identifier found."""
    out: list[Span] = []
    for m in _SSN_SHAPE.finditer(text):
        # Named as an SSN, it is one even in a range stdnum knows is not issued (an SSN
        # has no check digit): the caller said it is theirs.
        if _stdnum("us.ssn")(m.group()) or _named_before(text, m.start(), ID_WORDS):
            out.append((m.start(), m.end(), "national_id"))
    for m in _NINO.finditer(text):
        if _nino_ok(m):
            out.append((m.start(), m.end(), "national_id"))
    for m in _DIGITS.finditer(text):
        if not _named_before(text, m.start(), ID_WORDS):
            continue
        number = re.sub(r"[ ./-]", "", m.group())
        if any(_safe(valid, number) for _name, valid in DIGIT_IDS):
            out.append((m.start(), m.end(), "national_id"))
    for m in _ALNUM.finditer(text):
        word = m.group()
        if not (any(c.isalpha() for c in word) and any(c.isdigit() for c in word)):
            continue
        if any(_safe(valid, word) for _name, valid in SHAPED_IDS):
            out.append((m.start(), m.end(), "national_id"))
    return out


def _safe(valid: Callable[[str], bool], number: str) -> bool:
    try:
        return valid(number)
    except Exception:  # noqa: BLE001 - a validator's own parsing error is "not this number"
        return False


_MONTHS = (
    r"jan(?:uary|uar|vier)?|feb(?:ruary|ruar)?|f[ée]vrier|m[äa]r(?:ch|z|s)?|apr(?:il)?|avril|"
    r"may|mai|jun(?:e|i)?|juin|jul(?:y|i)?|juillet|aug(?:ust)?|ao[ûu]t|sep(?:t(?:ember)?)?|"
    r"septembre|oct(?:ober)?|okt(?:ober)?|octobre|nov(?:ember)?|novembre|dec(?:ember)?|"
    r"dez(?:ember)?|d[ée]cembre|enero|febrero|marzo|abril|mayo|junio|julio|agosto|"
    r"septiembre|octubre|noviembre|diciembre|gennaio|febbraio|aprile|maggio|giugno|luglio|"
    r"settembre|ottobre|dicembre")
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th|er|\.)?"
_YEAR = r"(?:19|20)\d{2}"
_DATE = re.compile(
    rf"(?<![\w/.-])(?:"
    rf"{_YEAR}-[01]\d-[0-3]\d"                                     # 1985-03-14
    rf"|[0-3]?\d[./-][01]?\d[./-](?:{_YEAR}|\d{{2}})"              # 14/03/1985, 14.03.85
    rf"|[01]?\d/[0-3]?\d/{_YEAR}"                                  # 03/14/1985
    rf"|{_DAY}\s+(?:of\s+|de\s+)?(?:{_MONTHS})\.?,?\s+(?:de\s+)?{_YEAR}"   # 14 March 1985
    rf"|(?:{_MONTHS})\.?\s+{_DAY},?\s+{_YEAR}"                     # March 14, 1985
    rf")(?![\w/-]|\.\d)", re.IGNORECASE)


def dates_of_birth(text: str) -> list[Span]:
    """(start, end, "date_of_birth") of each date with birth words shortly before it."""
    return [(m.start(), m.end(), "date_of_birth") for m in _DATE.finditer(text)
            if _named_before(text, m.start(), BIRTH_WORDS)]
