"""Personal data inside free text: where it is, so redaction can mask it (pure).

Each kind is found by a library made for it (docs/redaction.md says why each one):

* phone numbers: `phonenumbers` (Google's libphonenumber): numbers valid in the configured
  regions, and any number written in international form (`+1 555 123 4567`);
* email addresses: a candidate pattern, each confirmed by `email-validator`'s syntax rules;
* payment card numbers: 13–19 digits (spaces or dashes allowed) that pass the Luhn check of
  `python-stdnum`; IBANs: `stdnum.iban`;
* street addresses: `pyap2` (US, Canadian and British addresses; rule-based, no model);
* national identifiers and dates of birth: `redaction/identifiers.py` (stdnum's validators;
  a date only with birth words before it).

Numbers and addresses as a transcript spells them ("four one five …", "anna dot berg at
firma dot de") are rewritten in written form first (`redaction/spoken.py`) and a finding
there masks the spoken words. A phone number in local form is read in the configured
regions and in the region of every number the same text (or, through the `Redactor`, the
same call) gives with its country code: a caller from +49 says their other number as 030 ….

None downloads anything at run time. A text longer than `SCAN_MAX` is not scanned: the
caller masks it whole (scanning it would cost seconds and a matcher's limits could let a
number through).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Literal

KINDS = ("card", "iban", "national_id", "date_of_birth", "email", "phone", "address")
SCAN_MAX = 100_000

_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", re.IGNORECASE)
# Words before a number that say it is a reference, not a phone: "order 0301234567".
_ID_BEFORE = re.compile(r"(?:\b(?:order|invoice|inv|ref|reference|ticket|booking|tracking|case|"
                        r"confirmation|parcel|shipment|transaction|serial|sku|rechnung|"
                        r"bestellung|auftrag|commande|facture|pedido|factura)\b[\s\w.:#-]{0,12}"
                        r"|[#\w]-?)$", re.IGNORECASE)
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")
_DIGIT = re.compile(r"\d")


AddressCountry = Literal["US", "CA", "GB"]  # (the countries pyap2 parses)


@dataclass(frozen=True)
class PiiScanner:
    """Finds personal data in text. `regions`: where a phone number written without its
    country code is read as a local number (ISO 3166 codes); `address_countries`: pyap2's
    countries (US, CA, GB)."""

    kinds: tuple[str, ...] = KINDS
    regions: tuple[str, ...] = ("US", "GB")
    address_countries: tuple[AddressCountry, ...] = ("US", "CA", "GB")

    def spans(self, text: str, call_regions: tuple[str, ...] = ()) -> list[tuple[int, int, str]]:
        """(start, end, kind) of every finding, without overlaps, in text order.
        `call_regions`: regions learnt from the rest of the call (`regions_in`)."""
        from .redaction.spoken import normalise

        written = normalise(text)
        if written is None:
            return self._spans(text, call_regions)
        return _merge([(*written.original_span(s, e), k)
                       for s, e, k in self._spans(written.text, call_regions)])

    def regions_in(self, text: str) -> set[str]:
        """The regions of the numbers `text` gives with their country code."""
        import phonenumbers

        if "phone" not in self.kinds or _DIGIT.search(text) is None:
            return set()
        return {r for m in phonenumbers.PhoneNumberMatcher(text, None)
                if (r := phonenumbers.region_code_for_number(m.number))
                and r != "001"}

    def _spans(self, text: str, call_regions: tuple[str, ...]) -> list[tuple[int, int, str]]:
        from .redaction.identifiers import dates_of_birth, national_ids

        found: list[tuple[int, int, str]] = []
        has_digit = _DIGIT.search(text) is not None
        if "card" in self.kinds and has_digit:
            found += _cards(text)
        if "iban" in self.kinds and has_digit:
            found += _ibans(text)
        if "national_id" in self.kinds and has_digit:
            found += national_ids(text)
        if "date_of_birth" in self.kinds and has_digit:
            found += dates_of_birth(text)
        if "email" in self.kinds and "@" in text:
            found += _emails(text)
        if "phone" in self.kinds and has_digit:
            regions = dict.fromkeys(self.regions + call_regions)
            regions.update(dict.fromkeys(sorted(self.regions_in(text))))
            found += _phones(text, tuple(regions))
        if "address" in self.kinds and has_digit:
            # An address never spans another finding: pyap reads "My IBAN is GB29 …" as
            # a street, and the merge would take the sentence with it.
            others = list(found)
            found += [a for a in _addresses(text, self.address_countries)
                      if not any(s < a[1] and a[0] < e for s, e, _k in others)]
        return _merge(found)

    def mask(self, text: str, mask: str = "[REDACTED:{kind}]",
             call_regions: tuple[str, ...] = ()) -> tuple[str, list[str]]:
        """The text with each finding replaced by `mask`, and the kinds found (in order)."""
        spans = self.spans(text, call_regions)
        if not spans:
            return text, []
        out, at = [], 0
        for start, end, kind in spans:
            out.append(text[at:start])
            out.append(mask.replace("{kind}", kind))
            at = end
        out.append(text[at:])
        return "".join(out), [k for _s, _e, k in spans]


def _merge(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping findings become one (the earlier kind names it: a card before a phone)."""
    out: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(spans, key=lambda s: (s[0], -s[1])):
        if out and start < out[-1][1]:
            prev = out[-1]
            out[-1] = (prev[0], max(prev[1], end), prev[2])
        else:
            out.append((start, end, kind))
    return out


def _cards(text: str) -> list[tuple[int, int, str]]:
    from stdnum import luhn

    out = []
    for m in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", m.group())
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            out.append((m.start(), m.end(), "card"))
    return out


def _ibans(text: str) -> list[tuple[int, int, str]]:
    from stdnum import iban

    out = []
    for m in _IBAN.finditer(text):
        # Read case-insensitively, a candidate can run on into the next word ("… 32
        # thanks"): the longest prefix ending at a word's end that is an IBAN.
        ends = [m.end()] + [m.start() + i for i in range(len(m.group()) - 1, 14, -1)
                            if m.group()[i] == " "]
        for end in ends:
            if iban.is_valid(text[m.start():end].upper()):
                out.append((m.start(), end, "iban"))
                break
    return out


def _emails(text: str) -> list[tuple[int, int, str]]:
    from email_validator import EmailNotValidError, validate_email

    out = []
    for m in _EMAIL.finditer(text):
        try:
            validate_email(m.group(), check_deliverability=False)
        except EmailNotValidError:
            continue
        out.append((m.start(), m.end(), "email"))
    return out


def _phones(text: str, regions: tuple[str, ...]) -> list[tuple[int, int, str]]:
    import phonenumbers
    from phonenumbers import Leniency

    out = []
    # Written with its country code: any plausible number (a fictional 555 one included);
    # without it, only a number valid in one of the regions (else every long id would go).
    passes = [(None, Leniency.POSSIBLE)] + [(r, Leniency.VALID) for r in regions]
    for region, leniency in passes:
        for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=leniency,
                                                  max_tries=sys.maxsize):
            if region is not None and _ID_BEFORE.search(text[max(0, m.start - 32):m.start]):
                continue  # a local-form number after "invoice", "order #", "INV-": an id
            out.append((m.start, m.end, "phone"))
    return out


def _addresses(text: str, countries: tuple[AddressCountry, ...]) -> list[tuple[int, int, str]]:
    import pyap

    out = []
    for country in countries:
        for a in pyap.parse(text, country=country):
            out.append((a.match_start, a.match_end, "address"))
    return out
