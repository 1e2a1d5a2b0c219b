"""A corpus for `--redact`'s free-text scan: personal data as callers give it (typed by a
tool, said in a transcript, in English, German, French, Spanish and Italian) and look-alikes
that must stay. Every number with a check digit here passes it; all are invented.

`python -m tests.tools.redaction_corpus` prints the per-kind table of docs/redaction.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.tools.test_pii import MUST_STAY


@dataclass(frozen=True)
class Item:
    kind: str
    text: str
    #: what must not survive redaction (default: the whole text minus its first words)
    secrets: tuple[str, ...]
    #: the call's `language` setting, and a number the caller gave earlier in the call
    language: str | None = None
    caller: str | None = None


def _i(kind: str, text: str, *secrets: str, language: str | None = None,
       caller: str | None = None) -> Item:
    return Item(kind, text, secrets, language, caller)


PHONES = [
    _i("phone", "call me on +1 555 123 4567", "555 123 4567"),
    _i("phone", "my number is (415) 555-2671, after 6", "555-2671"),
    _i("phone", "reach me at 202-555-0143 tomorrow", "555-0143"),
    _i("phone", "office line (212) 555-0187 ext 4", "555-0187"),
    _i("phone", "ring 020 7946 0958 please", "7946 0958"),
    _i("phone", "+44 20 7946 0958 is the desk", "7946 0958"),
    _i("phone", "UK mobile +44 7700 900123", "7700 900123"),
    _i("phone", "+33 1 23 45 67 89 ou le portable", "23 45 67 89"),
    _i("phone", "Rufen Sie mich an: +49 30 12345678", "12345678"),
    _i("phone", "Handy +49 171 2345678", "2345678"),
    _i("phone", "+91 98765 43210 is my WhatsApp", "98765 43210"),
    _i("phone", "llámame al +34 612 34 56 78", "34 56 78"),
    _i("phone", "chiamami al +39 06 1234 5678", "1234 5678"),
    _i("phone", "bel me op +31 6 12345678", "12345678"),
    _i("phone", "call +1 (416) 555-0199 in Toronto", "555-0199"),
    _i("phone", "+61 412 345 678 is my Aussie number", "345 678"),
    _i("phone", "the callback number is 4155552671", "4155552671"),
    _i("phone", "Meine Nummer ist 030 12345678", "12345678", language="de-DE"),
    _i("phone", "oder mobil 0171 2345678", "2345678", language="de-DE"),
    _i("phone", "Festnetz 089 1234567, bitte abends", "1234567", language="de-DE"),
    _i("phone", "rappelez-moi au 01 23 45 67 89", "23 45 67 89", language="fr-FR"),
    _i("phone", "mon portable: 06 12 34 56 78", "12 34 56 78", language="fr-FR"),
    _i("phone", "à Marseille 04 91 23 45 67", "91 23 45 67", language="fr-FR"),
    _i("phone", "my number is 98765 43210", "98765 43210", language="en-IN"),
    _i("phone", "office 022 2345 6789", "2345 6789", language="en-IN"),
    _i("phone", "mi móvil es 612 34 56 78", "612 34 56 78", language="es-ES"),
    _i("phone", "il mio numero è 06 1234 5678", "1234 5678", language="it-IT"),
    _i("phone", "my other number is 0176 98765432", "98765432", caller="+49 30 12345678"),
    _i("phone", "at home: 040 3344556", "3344556", caller="+49 171 2345678"),
    _i("phone", "sinon le 06 12 34 56 78", "12 34 56 78", caller="+33 1 23 45 67 89"),
    _i("phone", "or landline 022 2345 6789", "2345 6789", caller="+91 98765 43210"),
    _i("phone", "my cell is 415.555.2671", "555.2671"),
    _i("phone", "text 1-800-555-0199 for help", "555-0199"),
    _i("phone", "phone: +1-202-555-0143; email later", "555-0143"),
    _i("phone", "call me back on 07400 123 456", "123 456"),
]

SPOKEN_PHONES = [
    _i("phone", "it's four one five, five five five, two six seven one",
       "four one five, five five five, two six seven one"),
    _i("phone", "my number is two zero two five five five zero one four three",
       "two zero two five five five zero one four three"),
    _i("phone", "you can call nine one seven, five five five, zero one two three",
       "nine one seven, five five five, zero one two three"),
    _i("phone", "oh two oh, seven nine four six, oh nine five eight",
       "seven nine four six, oh nine five eight"),
    _i("phone", "plus four four, seven seven double oh, nine double oh one two three",
       "seven seven double oh, nine double oh one two three"),
    _i("phone", "it's four one five, five five five, twenty-six seventy-one",
       "five five five, twenty-six seventy-one"),
    _i("phone", "plus one, two one two, five five five, oh one eight seven",
       "two one two, five five five, oh one eight seven"),
    _i("phone", "meine Nummer ist null drei null, eins zwei drei vier fünf sechs sieben acht",
       "eins zwei drei vier fünf sechs sieben acht", language="de-DE"),
    _i("phone", "null eins sieben eins, zwei drei vier fünf sechs sieben acht",
       "zwei drei vier fünf sechs sieben acht", language="de-DE"),
    _i("phone", "plus vier neun, drei null, eins zwei drei vier fünf sechs sieben acht",
       "eins zwei drei vier fünf sechs sieben acht"),
    _i("phone", "c'est zéro six, un deux, trois quatre, cinq six, sept huit",
       "un deux, trois quatre, cinq six, sept huit", language="fr-FR"),
    _i("phone", "mi número es seis uno dos, tres cuatro, cinco seis, siete ocho",
       "seis uno dos, tres cuatro, cinco seis, siete ocho", language="es-ES"),
    _i("phone", "il numero è zero sei, uno due tre quattro, cinque sei sette otto",
       "uno due tre quattro, cinque sei sette otto", language="it-IT"),
    _i("phone", "nine eight seven six five, four three two one zero",
       "nine eight seven six five, four three two one zero", language="en-IN"),
    _i("phone", "call 415 555 two six seven one", "555 two six seven one"),
    _i("phone", "reach me on two oh two, five five five, oh one four three",
       "two oh two, five five five, oh one four three"),
]

EMAILS = [
    _i("email", "mail bob@example.com now", "bob@example.com"),
    _i("email", "Bob.O'Neil+news@sub.example.co.uk wrote", "O'Neil+news@sub.example.co.uk"),
    _i("email", "send it to anna.berg@firma.de please", "anna.berg@firma.de"),
    _i("email", "contact: j_smith99@mail.example.org", "j_smith99@mail.example.org"),
    _i("email", "Mein E-Mail: maria-luisa@beispiel.de", "maria-luisa@beispiel.de"),
    _i("email", "écrivez à jean.dupont@exemple.fr", "jean.dupont@exemple.fr"),
    _i("email", "escríbeme a lucia.garcia@ejemplo.es", "lucia.garcia@ejemplo.es"),
    _i("email", "la mia email è marco.rossi@esempio.it", "marco.rossi@esempio.it"),
    _i("email", "cc priya.sharma@example.in on it", "priya.sharma@example.in"),
    _i("email", "<bob@example.com> is on file", "bob@example.com"),
    _i("email", "email=BOB@EXAMPLE.COM", "BOB@EXAMPLE.COM"),
    _i("email", "use tom+orders@shop.example.com", "tom+orders@shop.example.com"),
    _i("email", "reply to support-ticket.4411@helpdesk.example.net", "4411@helpdesk.example.net"),
    _i("email", "my address is firstname.lastname@company.co.uk.", "lastname@company.co.uk"),
    _i("email", "(alice@example.org)", "alice@example.org"),
]

SPOKEN_EMAILS = [
    _i("email", "it's anna dot berg at firma dot de", "anna dot berg at firma dot de"),
    _i("email", "mail me at bob at example dot com", "bob at example dot com"),
    _i("email", "jean dot dupont at exemple dot fr s'il vous plaît",
       "jean dot dupont at exemple dot fr"),
    _i("email", "meine Adresse ist maria punkt schmidt at beispiel punkt de",
       "maria punkt schmidt at beispiel punkt de"),
    _i("email", "c'est jean point dupont arobase exemple point fr",
       "jean point dupont arobase exemple point fr"),
    _i("email", "es lucia punto garcia arroba ejemplo punto es",
       "lucia punto garcia arroba ejemplo punto es"),
    _i("email", "scrivi a marco punto rossi chiocciola esempio punto it",
       "marco punto rossi chiocciola esempio punto it"),
    _i("email", "priya dot sharma at example dot co dot in", "priya dot sharma at example dot co"),
    _i("email", "tom at shop dot example dot com, thanks", "tom at shop dot example dot com"),
    _i("email", "send to alice at example dot org", "alice at example dot org"),
    _i("email", "my email is j smith at gmail dot com", "smith at gmail dot com"),
    _i("email", "thomas dot müller at firma dot de", "thomas dot müller at firma dot de"),
]

CARDS = [
    _i("card", "card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    _i("card", "card 4111-1111-1111-1111", "4111-1111-1111-1111"),
    _i("card", "amex 378282246310005", "378282246310005"),
    _i("card", "Mastercard 5500 0055 5555 5559", "5500 0055 5555 5559"),
    _i("card", "discover 6011111111111117 please", "6011111111111117"),
    _i("card", "JCB 3530 1113 3330 0000", "3530 1113 3330 0000"),
    _i("card", "visa 4012888888881881", "4012888888881881"),
    _i("card", "Kreditkarte 5105 1051 0510 5100", "5105 1051 0510 5100"),
    _i("card", "carte bancaire 4111 1111 1111 1111", "4111 1111 1111 1111"),
    _i("card", "tarjeta 3714 496353 98431", "3714 496353 98431"),
    _i("card", "the card is four one one one, one one one one, one one one one, one one one one",
       "four one one one, one one one one, one one one one, one one one one"),
    _i("card", "card number: 4111111111111111, cvv later", "4111111111111111"),
]

IBANS = [
    _i("iban", "IBAN GB82 WEST 1234 5698 7654 32 thanks", "GB82 WEST 1234 5698 7654 32"),
    _i("iban", "My IBAN is GB29 NWBK 6016 1331 9268 19, sort it out", "GB29 NWBK 6016 1331 9268 19"),
    _i("iban", "meine IBAN: DE89 3704 0044 0532 0130 00", "DE89 3704 0044 0532 0130 00"),
    _i("iban", "DE89370400440532013000", "DE89370400440532013000"),
    _i("iban", "iban de89 3704 0044 0532 0130 00", "de89 3704 0044 0532 0130 00"),
    _i("iban", "gb29nwbk60161331926819 is the account", "gb29nwbk60161331926819"),
    _i("iban", "IBAN FR14 2004 1010 0505 0001 3M02 606", "FR14 2004 1010 0505 0001 3M02 606"),
    _i("iban", "cuenta ES91 2100 0418 4502 0005 1332", "ES91 2100 0418 4502 0005 1332"),
    _i("iban", "conto IT60 X054 2811 1010 0000 0123 456", "IT60 X054 2811 1010 0000 0123 456"),
    _i("iban", "rekening NL91 ABNA 0417 1643 00", "NL91 ABNA 0417 1643 00"),
    _i("iban", "Swiss account CH93 0076 2011 6238 5295 7", "CH93 0076 2011 6238 5295 7"),
    _i("iban", "pay into Gb29 Nwbk 6016 1331 9268 19", "Gb29 Nwbk 6016 1331 9268 19"),
]

NATIONAL_IDS = [
    _i("national_id", "my SSN is 526-01-8159", "526-01-8159"),
    _i("national_id", "SSN 186-09-1390 on the form", "186-09-1390"),
    _i("national_id", "social security number 628194821", "628194821"),
    _i("national_id", "ssn: 543 23 1948", "543 23 1948"),
    _i("national_id", "my social is 757-49-1186", "757-49-1186"),
    _i("national_id", "the last customer gave 252-76-0189", "252-76-0189"),
    _i("national_id", "social security, five two six, zero one, eight one five nine",
       "five two six, zero one, eight one five nine"),
    _i("national_id", "my SSN is five two six dash zero one dash eight one five nine",
       "five two six dash zero one dash eight one five nine"),
    _i("national_id", "NI number AB 12 34 56 C", "AB 12 34 56 C"),
    _i("national_id", "national insurance JG103759A", "JG103759A"),
    _i("national_id", "my NINO is ce 10 37 59 d", "ce 10 37 59 d"),
    _i("national_id", "NI: PE 42 81 93 B", "PE 42 81 93 B"),
    _i("national_id", "Steuer-ID 31952716017", "31952716017"),
    _i("national_id", "meine Steueridentifikationsnummer ist 46518629071", "46518629071"),
    _i("national_id", "Identifikationsnummer: 30243638959", "30243638959"),
    _i("national_id", "numéro de sécurité sociale 368960380067471", "368960380067471"),
    _i("national_id", "NIR 2 23 15 69 786 585 48", "69 786 585"),
    _i("national_id", "Aadhaar 4081 3691 7397", "4081 3691 7397"),
    _i("national_id", "my aadhaar number is 676995581629", "676995581629"),
    _i("national_id", "PAN ABCPE1234F", "ABCPE1234F"),
    _i("national_id", "PAN card BNZPM2501F", "BNZPM2501F"),
    _i("national_id", "DNI 48291736Q", "48291736Q"),
    _i("national_id", "mi DNI es 70315882-Y", "70315882-Y"),
    _i("national_id", "NIE X1234567L", "X1234567L"),
    _i("national_id", "codice fiscale RSSMRA85T10A562S", "RSSMRA85T10A562S"),
    _i("national_id", "BSN 394649059", "394649059"),
    _i("national_id", "my SIN is 143 744 688", "143 744 688"),
    _i("national_id", "PESEL 48312230904", "48312230904"),
    _i("national_id", "CPF 788.559.644-37", "788.559.644-37"),
    _i("national_id", "id number 408136917397 (Aadhaar)", "408136917397"),
]

BIRTH_DATES = [
    _i("date_of_birth", "born on 14 March 1985", "14 March 1985"),
    _i("date_of_birth", "DOB 1985-03-14", "1985-03-14"),
    _i("date_of_birth", "date of birth: 03/14/1985", "03/14/1985"),
    _i("date_of_birth", "I was born March 14, 1985 in Ohio", "March 14, 1985"),
    _i("date_of_birth", "birthday is 14/03/1985", "14/03/1985"),
    _i("date_of_birth", "geboren am 14.03.1985", "14.03.1985"),
    _i("date_of_birth", "Geburtsdatum 2. Mai 1979", "2. Mai 1979"),
    _i("date_of_birth", "née le 5 juin 1990", "5 juin 1990"),
    _i("date_of_birth", "date de naissance : 05/06/1990", "05/06/1990"),
    _i("date_of_birth", "nacida el 7 de julio de 1972", "7 de julio de 1972"),
    _i("date_of_birth", "fecha de nacimiento 07/07/1972", "07/07/1972"),
    _i("date_of_birth", "nato il 10 dicembre 1985", "10 dicembre 1985"),
    _i("date_of_birth", "d.o.b. 1 Jan 1960", "1 Jan 1960"),
    _i("date_of_birth", "my date of birth is the 3rd of April 1968", "3rd of April 1968"),
    _i("date_of_birth", "birth date: Sept 9, 2001", "Sept 9, 2001"),
    _i("date_of_birth", "DOB: 12.11.83", "12.11.83"),
]

ADDRESSES = [
    _i("address", "ship to 1600 Amphitheatre Parkway, Mountain View, CA 94043 please",
       "1600 Amphitheatre Parkway", "94043"),
    _i("address", "I'm at 221B Baker Street, London NW1 6XE", "221B Baker Street", "NW1 6XE"),
    _i("address", "deliver to 350 Fifth Avenue, New York, NY 10118", "350 Fifth Avenue"),
    _i("address", "home: 742 Evergreen Terrace, Springfield, IL 62704", "742 Evergreen Terrace"),
    _i("address", "send it to 10 Downing Street, London SW1A 2AA", "10 Downing Street"),
    _i("address", "my address is 1 Infinite Loop, Cupertino, CA 95014", "1 Infinite Loop"),
    _i("address", "post to 55 Queen St W, Toronto, ON M5H 2M9", "55 Queen St W"),
    _i("address", "4059 Mt Lee Dr, Hollywood, CA 90068 is the house", "4059 Mt Lee Dr"),
]

# Items in several places of one text (each kind counted once per item).
MIXED = [
    _i("phone", "+44 20 7946 0958 or +33 1 23 45 67 89", "7946 0958", "23 45 67 89"),
    _i("email", "call me on +1 555 123 4567 or mail bob@example.com", "bob@example.com",
       "555 123 4567"),
    _i("iban", "refund GB29 NWBK 6016 1331 9268 19 and confirm to anna.berg@firma.de",
       "6016 1331 9268 19", "anna.berg@firma.de"),
    _i("national_id", "SSN 526-01-8159, DOB 1985-03-14", "526-01-8159", "1985-03-14"),
]

# More of each kind, in the forms support tickets showed.
MORE = [
    _i("phone", "WhatsApp: +49 176 98765432", "98765432"),
    _i("phone", "Tel. +49 (0)30 12345678", "12345678"),
    _i("phone", "tel: +33 6 12 34 56 78", "12 34 56 78"),
    _i("phone", "num +34 912 345 678", "345 678"),
    _i("phone", "Ruf an unter 0049 30 12345678", "12345678"),
    _i("phone", "my US number +1.415.555.2671", "555.2671"),
    _i("phone", "work: (646) 555-0123 x12", "555-0123"),
    _i("phone", "emergency contact 312-555-0175 (my sister)", "555-0175"),
    _i("phone", "Tel 0221 9876543", "9876543", language="de-DE"),
    _i("phone", "appelez le 05 56 12 34 56", "12 34 56", language="fr-FR"),
    _i("phone", "fijo 91 234 56 78", "234 56 78", language="es-ES"),
    _i("phone", "cellulare 347 123 4567", "123 4567", language="it-IT"),
    _i("phone", "mobile 07911 123456", "123456"),
    _i("phone", "call 0161 496 0000 in Manchester", "496 0000"),
    _i("email", "write to noreply.customer7@example-mail.com", "customer7@example-mail.com"),
    _i("email", "E-Mail an k.weber@example.de schicken", "k.weber@example.de"),
    _i("email", "mail: sofia_lopez@correo.example.es", "sofia_lopez@correo.example.es"),
    _i("email", "giulia.bianchi+shop@example.it ha scritto", "giulia.bianchi+shop@example.it"),
    _i("email", "raj dot patel at example dot in", "raj dot patel at example dot in"),
    _i("email", "k punkt weber at example punkt de bitte", "k punkt weber at example punkt de"),
    _i("card", "Visa 4012 8888 8888 1881 expires 09/28", "4012 8888 8888 1881"),
    _i("card", "MC 5555 5555 5555 4444", "5555 5555 5555 4444"),
    _i("card", "Amex 3782 822463 10005", "3782 822463 10005"),
    _i("iban", "Überweisung an DE75 5121 0800 1245 1261 99", "DE75 5121 0800 1245 1261 99"),
    _i("iban", "BE71 0961 2345 6769 is the Belgian one", "BE71 0961 2345 6769"),
    _i("iban", "iban: fr7630006000011234567890189", "fr7630006000011234567890189"),
    _i("national_id", "SSN: 078-05-1120", "078-05-1120"),
    _i("national_id", "social security no. 219-09-9999", "219-09-9999"),
    _i("national_id", "National Insurance number: NA 58 31 26 A", "NA 58 31 26 A"),
    _i("national_id", "NI no TW 98 76 54 C", "TW 98 76 54 C"),
    _i("national_id", "tax id 81604358893 (Steuer-ID)", "81604358893"),
    _i("national_id", "aadhaar: 9870 5254 8278", "9870 5254 8278"),
    _i("national_id", "DNI: 23456781R", "23456781R"),
    _i("national_id", "NIE X7654321J", "X7654321J"),
    _i("date_of_birth", "born 22/11/1979", "22/11/1979"),
    _i("date_of_birth", "Geburtstag: 3. Oktober 1990", "3. Oktober 1990"),
    _i("date_of_birth", "DOB November 5, 1955", "November 5, 1955"),
    _i("date_of_birth", "date of birth 1990-10-03 per the form", "1990-10-03"),
    _i("address", "ship to 123 Main Street, Springfield, IL 62701", "123 Main Street"),
    _i("address", "address 500 W Madison St, Chicago, IL 60661", "500 W Madison St"),
]


def _more_spoken() -> list[Item]:
    """Phone numbers of each language as a transcript spells them, digit by digit."""
    words = {"en": "zero one two three four five six seven eight nine".split(),
             "de": "null eins zwei drei vier fünf sechs sieben acht neun".split(),
             "fr": "zéro un deux trois quatre cinq six sept huit neuf".split(),
             "es": "cero uno dos tres cuatro cinco seis siete ocho nueve".split(),
             "it": "zero uno due tre quattro cinque sei sette otto nove".split()}
    numbers = {"en": ("en-US", "2125550187"), "de": ("de-DE", "08912345678"),
               "fr": ("fr-FR", "0491234567"), "es": ("es-ES", "612345678"),
               "it": ("it-IT", "0612345678")}
    lead = {"en": "the number is", "de": "die Nummer ist", "fr": "le numéro est",
            "es": "el número es", "it": "il numero è"}
    out = []
    for lang, (language, digits) in numbers.items():
        spoken = " ".join(words[lang][int(d)] for d in digits)
        out.append(_i("phone", f"{lead[lang]} {spoken}", spoken, language=language))
        grouped = ", ".join(" ".join(words[lang][int(d)] for d in digits[i:i + 3])
                            for i in range(0, len(digits), 3))
        out.append(_i("phone", f"{lead[lang]} {grouped}, ok?", grouped, language=language))
    return out


PERSONAL = (PHONES + SPOKEN_PHONES + _more_spoken() + EMAILS + SPOKEN_EMAILS + CARDS + IBANS
            + NATIONAL_IDS + BIRTH_DATES + ADDRESSES + MIXED + MORE)

#: Texts whose numbers are not personal data: redaction must leave them as they are.
LOOK_ALIKES = [
    *MUST_STAY,  # (test_pii's own, first)
    "INV-2026-004417 paid in full",
    "invoice 2026004417 is overdue",
    "order #3012345678 left the warehouse",
    "tracking 1Z999AA10123456784",
    "ticket 20260412-0042 closed",
    "booking ref 0301234567",
    "the delivery is on 14 March 2026",
    "appointment 03/14/2026 at 9",
    "meeting on 2026-03-14 about order 884421",
    "Termin am 14.03.2026 um 10 Uhr",
    "Lieferung am 2. Mai 2026",
    "rendez-vous le 5 juin 2026",
    "la cita es el 7 de julio de 2026",
    "created 2025-11-30T14:22:05Z",
    "price 1299.99 EUR, tax 246.98",
    "SKU 4006381333931",
    "ISBN 978-3-16-148410-0",
    "serial number 5551234567",
    "transaction 98765432101 approved",
    "reference 123-45-6789-00",
    "pallet 12 of 40, bay 33",
    "temperature 21.5 degrees",
    "model gemini-2.5-flash, 16000 Hz audio",
    "call lasted 00:04:31",
    "IP 192.168.100.200 answered",
    "coordinates 48.137154, 11.576124",
    "HTTP 503 after 30000 ms",
    "batch 20261205 of 2026",
    "the code is 482913",
    "PIN length 4, attempts 3",
    "quantity one two three items",
    "she is one of two sisters",
    "I said one, two, three",
    "meet at five at the station",
    "at home dot",
    "he was born in 1985",
    "born to run, 1975 album",
    "the company was born on 1 April 2001 as a startup? no: founded 2001",
    "version one point two",
    "press one, then two",
    "dial 911 in an emergency",
    "flight LH 2041 at gate B22",
    "Rechnung RE-2026-00417 bezahlt",
    "facture FA-2026-0042 réglée",
    "pedido 2026/00417 enviado",
    "account tier 3, region eu-west-1",
    "error code E-5021-7788",
    "the total is 4,111.11 dollars",
    "postcode district 10, zone 44",
    "bus 42 to platform 9",
    "uuid 550e8400-e29b-41d4-a716-446655440000",
    "hash 9f86d081884c7d659a2feaa0c55ad015",
    "page 12 of 148",
    "weight 72 kg, height 180 cm",
    "ABC123DEF is the promo code",
    "size 10.5 US",
    "year 1999 to 2001",
    "order INV-2026-004417-B",
    "ticket #4155552671 has been escalated",
    "our hotline is open 9 to 5",
    "12/29 is the expiry month",
    "it costs 89 euros a month",
    "3 x 4 = 12",
    "gate 12, seat 34A",
    "count: 1,234,567",
    "version 10.0.19045.3693",
]
assert len(PERSONAL) >= 200, len(PERSONAL)


def table(results: dict[str, tuple[int, int]], false_pos: tuple[int, int]) -> str:
    """Markdown rows: kind, items, masked, recall."""
    rows = ["| kind | items | masked | recall |", "| --- | ---: | ---: | ---: |"]
    total = masked = 0
    for kind, (n, ok) in sorted(results.items()):
        rows.append(f"| `{kind}` | {n} | {ok} | {100 * ok / n:.1f}% |")
        total, masked = total + n, masked + ok
    rows.append(f"| all | {total} | {masked} | {100 * masked / total:.1f}% |")
    fp, n = false_pos
    rows.append(f"| look-alikes masked | {n} | {fp} | {100 * fp / n:.1f}% |")
    return "\n".join(rows)


if __name__ == "__main__":
    from tests.tools.test_redaction_corpus import measure

    found, fps, misses, fp_texts = measure()
    print(table(found, fps))
    for item, out in misses:
        print("missed:", item.kind, repr(item.text), "->", repr(out))
    for text, out in fp_texts:
        print("look-alike masked:", repr(text), "->", repr(out))
