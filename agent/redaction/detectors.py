"""Pattern detectors for the structured types, each checked the way the type allows.

EMAIL, PHONE (international and common national formats, 7 to 15 digits), CREDIT_CARD
(13 to 19 digits, a known issuer prefix and the Luhn check), IBAN (the country's length and
the ISO 13616 mod-97 check), US_SSN (the SSA's rules: no area 000, 666 or 9xx, no group
00, no serial 0000), IP_ADDRESS (IPv4 and IPv6, parsed by :mod:`ipaddress`; version
strings such as ``v1.2.3.4`` or ``version 10.0.0.1`` are not addresses) and SECRET (API keys
with a known shape, private keys, JWTs, bearer tokens, values after ``password=`` and the
like, and long mixed-case tokens with high entropy).

Every detector yields :class:`Span` objects over the text it was given; overlaps between
detectors are settled by :func:`agent.redaction.redactor.resolve`.
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from agent.redaction.mark_words import (
    ASSIGNED_MARKERS,
    NUMBER_WORDS,
    PHONE_WORDS,
    PHONE_WORDS_JOINED,
)
from agent.redaction.prefilter import (
    SHORT_TEXT,
    case_fold,
    finditer_from,
    first_words,
    keyword_starts,
    literal_starts,
    marks,
    re2_starts,
    words,
)

EMAIL = "EMAIL"
PHONE = "PHONE"
CREDIT_CARD = "CREDIT_CARD"
IBAN = "IBAN"
US_SSN = "US_SSN"
IP_ADDRESS = "IP_ADDRESS"
SECRET = "SECRET"
PERSON = "PERSON"
ADDRESS = "ADDRESS"

#: Every entity type, in the order overlaps are settled (earlier wins).
ENTITY_TYPES = (SECRET, EMAIL, IBAN, CREDIT_CARD, US_SSN, IP_ADDRESS, PHONE, ADDRESS, PERSON)


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    type: str


# ---------------------------------------------------------------------------- checksums


def luhn_ok(digits: str) -> bool:
    """The Luhn (mod 10) check of a string of digits."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# ISO 13616 lengths per country (the SWIFT IBAN registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BI": 27, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22,
    "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19,
    "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28, "NL": 18, "NO": 15, "OM": 23, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "RU": 33, "SA": 24, "SC": 31,
    "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25, "SV": 28, "TL": 23,
    "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}  # fmt: skip


def iban_ok(compact: str) -> bool:
    """Country length and the mod-97 check of an IBAN without spaces, upper case."""
    if IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(number) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    return area != "000" and area != "666" and area[0] != "9" and group != "00" and serial != "0000"


# ------------------------------------------------------------------------------ patterns

_EMAIL = re.compile(
    r"[\w.+%-](?<![\w.+%-][\s\S])[\w.+%-]{0,63}@(?:[^\W_](?:[\w-]{0,61}[^\W_])?\.)+[^\W\d_]{2,24}(?![\w-])"
)
# not after a plus (a phone number's country code: +5461143169786) or a letter, a digit and
# such; a card's digits in groups, a phone's groups before them are checked in find_cards
_CARD = re.compile(r"\d(?<![\w.,+\uff0b-][\s\S])[ -]?(?:\d[ -]?){10,17}\d(?![\w-]|[.,]\d)")
_IBAN = re.compile(
    r"[A-Za-z](?<![\w][\s\S])[A-Za-z]\d{2}(?:[ ]?[A-Za-z0-9]){11,30}(?![\w])",
)
_SSN = re.compile(r"(\d(?<![\w.+\uff0b-][\s\S])\d{2})([- ])(\d{2})\2(\d{4})(?![\w-]|[.,]\d)")
_SSN_BARE = re.compile(
    r"(?i:\b(?:ssn|social security(?: number| no\.?| #)?|sozialversicherungsnummer)"
    r"\W{0,4}(?:is\W{0,3}|was\W{0,3}|=\W{0,3})?)"
    r"(\d{3})(\d{2})(\d{4})(?!\w)"
)
_SSN_WORDS = ("ssn", "social", "sozial")  # what each of _SSN_BARE's matches starts with
_IPV4 = re.compile(r"\d(?<![\w.][\s\S])\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3}(?:/\d{1,2})?(?![\w]|\.\d)")
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{0,4}|(?:\d{1,3}\.){3}\d{1,3})"
    r"(?:/\d{1,3})?(?![\w:])"
)
_VERSION_AFTER = re.compile(r"(?i:\s(?:firmware|release|version|build|update|patch)\b)")
_VERSION_BEFORE = re.compile(
    r"(?i:(?:\bv|\bversion|\bver\.?|\brelease|\bbuild|\bfirmware|\bfw|\brev(?:ision)?|==|>=|<=|~=)\s?)$"
)
# Letters of the scripts written without spaces (Han, kana) and Hangul, whose particles join
# the word before them: a number may touch them ("電話03-1234-5678です", "010-1234-5678로").
_JOINING_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7a3"
# A letter or digit that a number cannot touch: a word character of another script.
_TOUCHING = rf"[^\W{_JOINING_LETTERS}]"
# Separators between a number's groups: also the fullwidth hyphen and ASCII look-alikes
# that CJK input methods type (fullwidth digits and U+FF0D between them; 03ー1234ー5678).
_SEP = "[ .\\-/\u2010\u2011\uff0d\u30fc]"
_DASH = "[ .\\-\u2010\u2011\uff0d\u30fc]"
_OPEN, _CLOSE = "[(\uff08]", "[)\uff09]"
# An international number: +CC then groups; or a national one with separators/parentheses.
_PHONE = re.compile(
    rf"(?<!{_TOUCHING})(?<![+\uff0b])(?:"  # +CC, (area), groups
    rf"(?:[+\uff0b]|00)\d{{1,3}}(?:{_SEP}?\(0\))?(?:{_SEP}?{_OPEN}?\d{{1,5}}{_CLOSE}?){{1,6}}"
    rf"|{_OPEN}\d{{2,5}}{_CLOSE}{_SEP}?\d{{2,5}}(?:{_DASH}?\d{{2,5}}){{0,3}}"  # (030) 1234 5678
    rf"|(?:\d{{2,5}}|0\d{{5}})(?:{_SEP}\d{{2,8}}|\s/\s\d{{2,8}}){{1,4}}"  # 089 / 1234
    # a one-digit trunk or country prefix: 1-800-555-0199, 8-912-345-67-89, 0 (212) 123 45 67
    rf"|[018]{_DASH}{_OPEN}?\d{{3}}{_CLOSE}?{_DASH}?\d{{3}}(?:{_DASH}\d{{2,4}}){{1,2}}"
    r"|\d{9,12}"  # 07700900123, 3420837783, 036245207
    r")(?:\s?(?:x|ext\.?|extension)\s?\d{1,6})?"  # an extension: 555-0100 x1234
    rf"(?!{_TOUCHING}|[-\uff0d]|[.,]\d)"
)
_ASCII_DASHES = str.maketrans({"\u2010": "-", "\u2011": "-", "\u30fc": "-"})
_PHONE_WORDS = "|".join(re.escape(w) for w in PHONE_WORDS)
_PHONE_WORDS_JOINED = "|".join(PHONE_WORDS_JOINED)
# (both searched in case_fold's text: a case-sensitive search costs half an IGNORECASE one;
# and only where the prefilter's "phone_word" mark says one of their words is in the text)
_PHONE_CONTEXT = re.compile(
    rf"\b(?:{_PHONE_WORDS}|{'|'.join(re.escape(w) for w in NUMBER_WORDS)})\b"
    rf"|{_PHONE_WORDS_JOINED}"
)
# The phone words that make any grouping of 7 to 15 digits a number: not "number", "no.",
# "nr" (order and invoice numbers have them)
_PHONE_WORD = re.compile(rf"\b(?:{_PHONE_WORDS})\b|{_PHONE_WORDS_JOINED}")
# Groupings of national numbers the shapes above leave out, read only after a phone word
# (the example numbers of every region in libphonenumber's metadata): a one-digit area
# ("2 2123456", "(2) 2123 4567", "9 435 1234"), an area in parentheses with a space or
# a hyphen inside ("(06 1) 234 5678", "(0-312) 34567", "(8 12) 34-56-78"), a trunk
# prefix before one ("8 (71234) 5 67 89"), eight digits in one group ("71234567", "01
# 234567890"). One character class, so cheap to scan for; what is around it is checked in
# _with_loose_phones.
_PHONE_LOOSE = re.compile(r"\d[\d \-()/\u2010\u2011\uff0d\uff08\uff09]{5,24}\d")
# Labels of tax and company numbers, whose digits look like national phone numbers (an
# Italian VAT number, "p.iva 01234567890", is eleven digits with a leading 0): as the end of
# the lower-case text before a number, its spaces, colons, # and dots taken off
_TAX_LABELS = (
    "p.iva", "p. iva", "piva", "partita iva", "codice fiscale", "vat", "vat no", "vat nr",
    "vat number", "vat id", "vat reg", "ust-id", "ustid", "ust-idnr", "ustidnr", "ust-id-nr",
    "steuer-nr", "steuernr", "steuernummer", "siret", "siren", "tva", "nif", "cif", "cnpj",
    "cpf", "inn", "ogrn", "kpp", "tin", "ein", "abn", "gstin", "kvk", "btw", "nip", "regon",
    "ičo", "dič", "org.nr", "org. nr", "orgnr", "cvr",
)  # fmt: skip


def _after_tax_label(text: str, start: int) -> bool:
    tail = text[max(0, start - 20) : start].rstrip(" \t:#.").lower()
    if not tail.endswith(_TAX_LABELS):
        return False
    label = max((x for x in _TAX_LABELS if tail.endswith(x)), key=len)
    return len(tail) == len(label) or not tail[-len(label) - 1].isalnum()  # a whole word


_TOUCHING_CHAR = re.compile(_TOUCHING)


def _as_ascii(raw: str) -> str:
    """A number's fullwidth digits and signs and CJK dashes read as their ASCII ones."""
    return raw if raw.isascii() else unicodedata.normalize("NFKC", raw).translate(_ASCII_DASHES)


_EXTENSION = re.compile(r"\s?(?:x|ext\.?|extension)\s?\d{1,6}$")
_NORTH_AMERICAN = re.compile(r"\(?[2-9]\d{2}\)?[ .\-]?\d{3}[ .\-]\d{4}")
# North American and Russian numbers after their one-digit trunk or country prefix
_TRUNK_FIRST = re.compile(
    r"1[ .\-]\(?[2-9]\d{2}\)?[ .\-]?\d{3}[ .\-]\d{4}"  # 1-800-555-0199
    r"|8[ \-]\(?9\d{2}\)?[ \-]?\d{3}-\d{2}-\d{2}"  # 8-912-345-67-89, 8 (912) 345-67-89
)
_FRENCH_DOTTED = re.compile(r"0\d(?:\.\d{2}){4}")  # 01.23.45.67.89
_CHINA_MOBILE = re.compile(r"1[3-9]\d[ \-]\d{4}[ \-]\d{4}")  # 138-0013-8000, 139 1234 5678
_TEN_DIGITS = re.compile(r"[2-9]\d{9}")
_SSN_SHAPE = re.compile(r"\d{3}-\d{2}-\d{4}")
_DATE_LIKE = re.compile(
    r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}|\d{1,2}:\d{2}"
)

# Without lookbehinds (they keep re from skipping ahead to a possible first character, 8x
# slower): what comes before a match is checked in find_secrets instead.
_SECRET_SHAPES = re.compile(
    r"(?:"
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
    r"|sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}"
    r"|(?:rk|pk|sk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|ef-[A-Za-z0-9]{4,}-[A-Za-z0-9_\-]{20,}"  # edgefleet API keys
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{40,}"
    r"|(?:gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-|GR1348941)[A-Za-z0-9_\-]{20,}"  # GitLab
    r"(?:\.[0-9a-z]{9}(?![\w]))?"  # a routable token's suffix
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}(?![\w])"  # AWS
    r"|AIza[0-9A-Za-z_\-]{35}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"  # SendGrid
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-[A-Za-z0-9_\-]{50,}"
    r"|do[opr]_v1_[a-f0-9]{64}"  # DigitalOcean
    r"|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"  # Shopify
    r"|key-[a-z0-9]{32}(?![\w])"  # Mailgun
    r"|whsec_[A-Za-z0-9]{24,}"  # Stripe webhooks
    r"|SK[0-9a-fA-F]{32}(?![\w])"  # Twilio
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    r"|https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+"
    # shapes whose key is a named group (find_secrets yields only it)
    r"|api\.softlayer\.com/soap/v3(?:\.1)?/(?P<softlayer>[a-z0-9]{64})(?![\w])"
    r"|BUNDLE_(?:ENTERPRISE|GEMS)__CONTRIBSYS__COM[ \t]*[=:][ \t]*[\"']?"  # Sidekiq
    r"(?P<sidekiq>[a-f0-9]{8}:[a-f0-9]{8})"
    r"|_gitlab_session=(?P<gitlab_session>[0-9a-z]{32})"
    # prefixed shapes of gitleaks' rules (its config/gitleaks.toml, MIT; read, not copied)
    r"|(?:dapi|dkea)[a-f0-9]{32}(?:-\d)?(?![\w])"  # Databricks
    r"|dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}(?![\w])"  # Doppler
    r"|dt0[a-z]\d{2}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"  # Dynatrace
    r"|duffel_(?:test|live)_[A-Za-z0-9_\-=]{43}"
    r"|fio-u-[A-Za-z0-9_\-=]{64}"  # Frame.io
    r"|dnkey-[a-z0-9=_\-]{26}-[a-z0-9=_\-]{52}"  # Defined Networking
    r"|glffct-[A-Za-z0-9_\-]{20}"  # GitLab feature flags
    r"|(?:pat|sat)\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}"  # Harness
    r"|[a-z0-9]{14}\.atlasv1\.[a-z0-9\-_=]{60,70}"  # Terraform Cloud
    r"|api_org_[A-Za-z]{34}(?![\w])"  # Hugging Face organisations
    r"|s-s4t2(?:ud|af)-[a-f0-9]{64}"  # 42 intra
    r"|lin_(?:api|oauth)_[A-Za-z0-9]{40}(?![\w])"  # Linear
    r"|NR(?:AK|JS|II)-[A-Za-z0-9\-]{19,32}(?![\w])"  # New Relic
    r"|API-[A-Z0-9]{26}(?![\w])"  # Octopus Deploy
    r"|sha256~[\w\-]{43}(?![\w\-])"  # OpenShift
    r"|pscale_(?:tkn|oauth|pw)_[A-Za-z0-9=\-_.]{32,64}"  # PlanetScale
    r"|PMAK-[a-f0-9]{24}-[a-f0-9]{34}"  # Postman
    r"|pul-[a-f0-9]{40}(?![\w])"  # Pulumi
    r"|rdme_[a-z0-9]{70}(?![\w])"  # ReadMe
    r"|rubygems_[a-f0-9]{48}(?![\w])"
    r"|xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}"  # Brevo (Sendinblue)
    r"|sntry[us]_[A-Za-z0-9+/=_\-]{64,}"  # Sentry
    r"|sm_(?:aat|pat|sat)_[A-Za-z0-9]{16}(?![\w])"  # SettleMint
    r"|shippo_(?:live|test)_[a-f0-9]{40}"
    r"|hv[sb]\.[A-Za-z0-9_\-]{90,}"  # HashiCorp Vault
    r"|AAAAAAAAAAAAAAAAAAAAA[A-Za-z0-9%]{30,}"  # Twitter bearer tokens
    r"|v1\.0-[a-f0-9]{24}-[a-f0-9]{146}"  # Cloudflare origin CA keys
    r"|A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}"
    r"|p8e-[A-Za-z0-9]{32}(?![\w])"  # Adobe
    r"|AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"
    r"|pat[A-Za-z0-9]{14}\.[a-f0-9]{64}"  # Airtable
    r"|[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}(?![\w~.\-])"  # Azure AD client secrets
    r"|sl\.[A-Za-z0-9\-=_]{130,}"  # Dropbox
    r"|HRKU-AA[0-9A-Za-z_\-]{58}"  # Heroku
    r"|EAA[MC][A-Za-z0-9]{100,}"  # Facebook page tokens
    r"|(?:live|test)_(?:pub_[a-f0-9]{31}|[a-f0-9]{35})(?![\w])"  # Lob
    r"|tfp_[A-Za-z0-9\-_.=]{59}"  # Typeform
    r"|access-(?:sandbox|development|production)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}"
    r"-[0-9a-f]{4}-[0-9a-f]{12}"  # Plaid
    r"|pubkey-[a-f0-9]{32}(?![\w])"  # Mailgun
    r"|t1\.[A-Za-z0-9_\-]+={0,2}\.[A-Za-z0-9_\-]{86}={0,2}"  # Yandex
    r"|AQVN[A-Za-z0-9_\-]{35,38}(?![\w])"  # Yandex
    r")"
)
# key = value / key: value / "key": "value" / Bearer value
# "password" in other languages (German, French, Spanish, Portuguese, Dutch, Polish, Czech,
# Swedish, Danish, Norwegian, Finnish, Hungarian, Turkish, Romanian, Indonesian, Vietnamese,
# Russian and Ukrainian, Chinese, Japanese, Korean, Arabic, Hindi); not the ones that are
# ordinary words too (Italian parola, Spanish clave)
_PASSWORD_WORDS = (
    "passwort|mot de passe|mdp|contraseña|contrasena|senha|wachtwoord|hasło|haslo|heslo|"
    "lösenord|losenord|adgangskode|passord|salasana|jelszó|jelszo|şifre|sifre|parolă|"
    "kata sandi|mật khẩu|mat khau|пароль|密码|密碼|口令|パスワード|暗証番号|비밀번호|"
    "كلمة المرور|كلمة السر|पासवर्ड"
)
_SECRET_ASSIGNED = re.compile(
    r"(?i:(?:(?:\b|_)(?:api[_\- ]?key|apikey|access[_\- ]?key|secret(?:[_\- ]?key)?|"
    r"client[_\- ]?secret|auth[_\- ]?token|access[_\- ]?token|refresh[_\- ]?token|"
    r"api[_\- ]?token|token|password|passwd|pwd|passphrase|private[_-]?key|account[_-]?key|"
    rf"shared[_-]?access[_-]?key|security answer|secret answer|kennwort|{_PASSWORD_WORDS})\b"
    # what it is the password of: "password for the wifi:", "contraseña del wifi:"
    r"(?:\s+(?:for|of|to|del|de|du|für|zum|zur|do|da|dla|pour)"
    r"(?:\s+(?:the|my|our|your|la|le|el|das|die|der|den))?\s+[^\s:=]{1,20})?"
    # linked by a sign, "is"/"was", or is in German, French, Spanish, Italian, Portuguese
    r"[\"']?\s*(?:[:=\uff1a]|\bis\b|\bwas\b|'s\b|\blautet\b|\bist\b|\best\b|\bes\b|"
    r"(?<=\s)[èé](?=\s))\s*[\"']?)"
    r"|(?:\b(?:pass|pw)\s*[:=\uff1a]\s*[\"']?)"  # "pass: ...", "pw: ...": by a sign only
    r"|(?:\bbearer\s+))"
    r"([^\s\"',;]{6,})"
)
# A pass that is a ticket's, not a password: "Boarding pass: ABC123"
_TICKET_PASSES = frozenset(
    "boarding bus day season ski guest visitor hall free backstage transit travel rail metro "  # noqa: SIM905
    "train press weekly monthly annual park museum festival event gym".split()
)
# A PIN after its word: four to eight digits (a password's rule asks for six characters);
# right after its word, or linked by a sign or "is"/"was" ("PIN code 7731", "PIN: 7731").
_PIN = re.compile(
    r"(?i:\b(?:pin|pin[ -]?code|code pin|codice pin|passcode|geheimzahl)\b\s*"
    r"(?:(?:[:=\uff1a]|\bis\b|\bwas\b)\s*)?)(\d{4,8})(?![\d\w])"
)
# A code that opens something or proves who one is, after its word: door, gate, alarm,
# one-time and verification codes, OTPs, card security codes, safe combinations; its value
# holds three digits or more ("the door code is broken" is prose). Not zip, area, error,
# status or promo codes: no word here names them.
_ACCESS_CODE = re.compile(
    r"(?i:\b(?:(?:door|gate|alarm|access|entry|entrance|building|garage|lock|keypad|safe|"
    r"security|verification|one[- ]time|otp|2fa|mfa|sms|login|backup|recovery|unlock)"
    r"[ -]?(?:code|passcode)s?|otp|cvv2?|cvc2?|csc|zugangscode|türcode|torcode|alarmcode|"
    r"digicode|code d'accès|code d'entrée|code porte|código de acceso|codice di accesso|"
    r"(?:safe |lock )?combination)\b\s*"
    r"(?:(?:[:=\uff1a]|\bis\b|\bwas\b|\bist\b|\blautet\b|\best\b|\bes\b)\s*)?)"
    r"([A-Za-z0-9][A-Za-z0-9#*\-]{2,15})(?![\w\-])"
)
_ACCESS_CODE_WORDS = (
    "code", "otp", "cvv", "cvc", "csc", "combination", "digicode", "código", "codice",
)  # fmt: skip
# The other codes of a list after "recovery codes:" / "backup codes:"
_NEXT_CODE = re.compile(r"\s*[,;]\s*([A-Za-z0-9][A-Za-z0-9\-]{3,15})(?![\w\-])")
# A password on a command line: mysql's -pSECRET, sshpass -p SECRET
_CLI_PASSWORD = re.compile(
    r"\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]{0,80}?\s-p([^\s'\"]{3,})"
    r"|\bsshpass\s+-p\s*['\"]?([^\s'\"]{3,})"
)
# Every keyword of _SECRET_ASSIGNED starts with one of these (folded): a match starts at one,
# or at the "_" before it; re tries only there (prefilter.finditer_from), not at every position.
_ASSIGNED_ROOTS = (
    "api", "access", "secret", "client", "auth", "refresh", "token", "pass", "pwd", "pw",
    "private", "account", "shared", "bearer", "security", "kennwort",
    "mot de", "mdp", "contras", "senha", "wacht", "hasło", "haslo", "heslo", "lösen",
    "losen", "adgang", "salas", "jelsz", "şifre", "sifre", "parol", "kata s", "mật", "mat k",
    "пароль", "密", "口令", "パス", "暗証", "비밀", "كلمة", "पास",
)  # fmt: skip
# What "bearer" is followed by in prose about tokens and bonds
_BEARER_PROSE = frozenset(
    ("tokens", "authentication", "authorization", "scheme", "credentials", "header", "headers",
     "bonds", "shares", "instrument", "instruments", "cheque", "cheques")
)  # fmt: skip
_URL_PASSWORD = re.compile(r"://[^:/\s@]{1,64}:([^@\s/]{3,128})@")
_LOOSE_WORDS = (
    "pass|pw|pin|passcode|kennwort|mot de passe|password|api key|api token|access token|secret key"
)
_LOOSE_PASSWORD = re.compile(rf"(?i:\b(?:{_LOOSE_WORDS})\s+)(\S{{8,64}})")
# one of these among a text's words, or _LOOSE_PASSWORD cannot match it
_LOOSE_GATE = first_words(_LOOSE_WORDS.split("|"))
_LOOSE_ROOTS = ("pass", "pw", "pin", "kennwort", "mot de passe", "api", "access", "secret")
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/](?<![\w\-+/.][\s\S])[A-Za-z0-9_\-+/]{23,}={0,2}(?![\w\-+/])")


def _entropy(s: str) -> float:
    counts = Counter(s)
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _looks_secret(token: str) -> bool:
    """A long token with upper, lower and digits and high entropy (not a word, path or hex)."""
    if "/" in token and token.count("/") > 2:
        return False  # a path
    has_upper = any(c.isupper() for c in token)
    has_lower = any(c.islower() for c in token)
    digits = sum(c.isdigit() for c in token)
    if not (has_upper and has_lower and digits >= 2):
        return False
    return _entropy(token) >= 4.0


# ------------------------------------------------------------------------------ detectors


def find_emails(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    """What ``_EMAIL.finditer`` finds, searched for only near each ``@``: a match holds one
    ``@`` and starts at most 64 characters before it, so no match starts between where
    the last one ended and 64 characters before the next ``@``."""
    pos = 0
    while (at := text.find("@", pos)) >= 0:
        m = _EMAIL.search(text, max(pos, at - 64))
        if m is None:
            return
        yield Span(m.start(), m.end(), EMAIL)
        pos = m.end()


# A group of digits and a separator just before a number: it is the end of a longer one
_LONGER_NUMBER_BEFORE = re.compile(r"\d[ \-]$")


def find_cards(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    if "card" not in (marks(text) if found is None else found):
        return
    for m in _CARD.finditer(text):
        raw = m.group()
        digits = raw.replace(" ", "").replace("-", "")
        if not 12 <= len(digits) <= 19 or digits[0] not in "123456":
            continue
        if (digits[0] == "1" and not digits.startswith("1800")) or (
            len(digits) == 12 and digits[0] not in "56"
        ):
            continue  # JCB's 1800 is the only 1; 12 digits only for Maestro
        if len(set(digits)) < 2 or not luhn_ok(digits):
            continue
        # separators, if any, must split the number into groups of at least 3 digits
        groups = re.split(r"[ -]", raw)
        if len(groups) > 1 and min(len(g) for g in groups) < 3:
            continue
        yield Span(m.start(), m.end(), CREDIT_CARD)


def iban_matches(text: str) -> Iterator[re.Match[str]]:
    """``_IBAN.finditer(text)``, tried only where two letters and two digits start (RE2)."""
    starts = re2_starts("iban", text)
    return _IBAN.finditer(text) if starts is None else finditer_from(_IBAN, text, starts)


def ipv4_matches(text: str) -> Iterator[re.Match[str]]:
    """``_IPV4.finditer(text)``, tried only where four dotted groups of digits start (RE2)."""
    starts = re2_starts("ipv4", text)
    return _IPV4.finditer(text) if starts is None else finditer_from(_IPV4, text, starts)


def find_ibans(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    if "iban" not in (marks(text) if found is None else found):
        return
    for m in iban_matches(text):
        raw = m.group()
        # a trailing word glued on by the optional spaces: shrink from the right
        end = len(raw)
        while end >= 15:
            compact = raw[:end].replace(" ", "").upper()
            if iban_ok(compact):
                yield Span(m.start(), m.start() + end, IBAN)
                break
            nxt = raw.rfind(" ", 0, end)
            if nxt < 0:
                break
            end = nxt


def ssn_matches(text: str) -> Iterator[re.Match[str]]:
    """``_SSN.finditer(text)``, tried only where RE2 finds its shape."""
    starts = re2_starts("ssn", text)
    return _SSN.finditer(text) if starts is None else finditer_from(_SSN, text, starts)


def find_ssns(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    found = marks(text) if found is None else found
    if "ssn" in found:
        for m in ssn_matches(text):
            if _LONGER_NUMBER_BEFORE.search(text, max(0, m.start() - 3), m.start()):
                continue  # the last groups of a phone number: +992 601 16 3156
            if ssn_ok(m.group(1), m.group(3), m.group(4)):
                yield Span(m.start(), m.end(), US_SSN)
    if "ssn_word" not in found:  # no "ssn", "social", "sozial" in any case
        return
    lowered = case_fold(text)  # as _SSN_BARE's (?i) reads it: "SOCİAL" holds "social"
    if "ssn" not in lowered and "social" not in lowered and "sozial" not in lowered:
        return
    # tried only where its words start, not at every position
    for m in finditer_from(_SSN_BARE, text, literal_starts(lowered, _SSN_WORDS)):
        if ssn_ok(m.group(1), m.group(2), m.group(3)):
            yield Span(m.start(1), m.end(3), US_SSN)


# The last character of each of _VERSION_BEFORE's words (v, version, ver., release, build,
# fw, rev, ==, ...), in either case: one of them is among the last three characters before a
# version number (then at most one space, then the end, or a newline at the end).
_VERSION_ENDS = frozenset("vVnNrReEdDwW.=")


def _version_context(text: str, start: int) -> bool:
    before = text[max(0, start - 12) : start]
    if _VERSION_ENDS.isdisjoint(before[-3:]):
        return False  # the search could not match: not made
    return bool(_VERSION_BEFORE.search(before))


def find_ips(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    if "ipv4" in (marks(text) if found is None else found):
        for m in ipv4_matches(text):
            addr = m.group().split("/")[0]
            try:
                ipaddress.IPv4Address(addr)
            except ValueError:
                continue
            if _version_context(text, m.start()) or _VERSION_AFTER.match(text, m.end()):
                continue
            yield Span(m.start(), m.end(), IP_ADDRESS)
    if "::" in text or text.count(":") >= 3:
        for m in ipv6_matches(text):
            addr = m.group().split("/")[0]
            if addr.count(":") < 2 or len(addr) < 3:
                continue
            try:
                ipaddress.IPv6Address(addr)
            except ValueError:
                continue
            if addr in ("::",):
                continue
            yield Span(m.start(), m.end(), IP_ADDRESS)


def ipv6_matches(text: str) -> Iterator[re.Match[str]]:
    """``_IPV6.finditer(text)``, tried only up to four characters before each colon (a match
    starts with at most four hex digits, then a colon)."""
    return finditer_from(_IPV6, text, literal_starts(text, ":", 4))


def find_phones(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    found = marks(text) if found is None else found
    if "phone" not in found:
        return
    if "phone_word" not in found:  # no phone word, no word for a number: shapes alone
        yield from _shaped_phones(text, False)
        return
    yield from _with_loose_phones(text, list(_shaped_phones(text, True)))


def _phone_context(text: str, start: int) -> bool:
    """A phone word, or a word for a number, in the 40 characters before ``start``."""
    return _PHONE_CONTEXT.search(case_fold(text[max(0, start - 40) : start])) is not None


def _phone_word_ends(text: str) -> list[int]:
    """Where each phone word (_PHONE_WORD, in the case-folded text) ends: searched where
    RE2 found one (prefilter's "phone_word" starts, one pass), or in the whole of a short
    text."""
    starts = re2_starts("phone_word", text)
    if starts is None:
        return [m.end() for m in _PHONE_WORD.finditer(case_fold(text))]
    # each start read in its own case-folded stretch (one character for one; the word
    # before it decides \b): folding the whole text costs more than the handful of words
    ends = []
    for at in starts:
        before = max(0, at - 1)
        m = _PHONE_WORD.match(case_fold(text[before : at + 24]), at - before)
        if m is not None:
            ends.append(before + m.end())
    return ends


def _with_loose_phones(text: str, spans: list[Span]) -> list[Span]:
    """The shaped numbers and the loose groupings of 7 to 15 digits (``_PHONE_LOOSE``) that
    follow a phone word within 24 characters with no other number between; a loose one
    that holds shaped ones (part of it) replaces them. In a long text the groupings are
    looked for after each phone word (RE2 finds those); in a short one the groupings come
    first and the words are looked for before the few left."""
    found = spans
    word_ends: list[int] | None = None
    if len(text) >= SHORT_TEXT:
        word_ends = _phone_word_ends(text)
        after_words = (_PHONE_LOOSE.search(text, e, e + 64) for e in word_ends)
        candidates: Iterable[re.Match[str]] = [m for m in after_words if m is not None]
    else:
        candidates = _PHONE_LOOSE.finditer(text)
    for m in candidates:
        start, end = m.span()
        if any(s.start <= start and end <= s.end for s in spans):
            continue  # nothing new
        if start and text[start - 1] in "(\uff08":
            start -= 1  # (2) 2123 4567
        raw = text[start:end]
        if raw.count("(") + raw.count("\uff08") > raw.count(")") + raw.count("\uff09"):
            if text[end : end + 1] not in (")", "\uff09"):
                continue
            end += 1
            raw += text[end - 1]
        if start and (text[start - 1] in "+\uff0b" or _TOUCHING_CHAR.match(text, start - 1)):
            continue  # a number touching letters, or an international one (_PHONE's)
        after = text[end : end + 2]
        if after and (
            _TOUCHING_CHAR.match(after)
            or after[0] in "-\uff0d"
            or (after[0] in ".,:" and after[1:].isdigit())
        ):
            continue  # 2 2123456-12, 2123 4567.89
        raw = _as_ascii(raw)
        if not 7 <= sum(c.isdigit() for c in raw) <= 15:
            continue
        if _DATE_LIKE.fullmatch(raw) or _SSN_SHAPE.fullmatch(raw):
            continue
        # the phone word close before it, with no other number between
        if word_ends is None:
            word_ends = _phone_word_ends(text)
        at = bisect_right(word_ends, start) - 1
        if at < 0 or start - word_ends[at] > 24:
            continue
        if any(c.isdigit() for c in text[word_ends[at] : start]):
            continue
        if _version_context(text, start):
            continue
        inside = [s for s in found if s.start < end and start < s.end]
        if any(s.start < start or s.end > end for s in inside):
            continue  # crosses a shaped number
        found = [s for s in found if s not in inside] + [Span(start, end, PHONE)]
    return sorted(found, key=lambda s: s.start) if found is not spans else spans


def _shaped_phones(text: str, words: bool) -> Iterator[Span]:
    """_PHONE's numbers; ``words``: whether the text may hold a phone word (else none is
    looked for)."""
    for m in _PHONE.finditer(text):
        raw = m.group()
        start, end = m.start(), m.end()
        raw = _as_ascii(raw)  # fullwidth digits and signs, CJK dashes: judged as ASCII
        # a closing parenthesis that the pattern took without its opening one
        if raw.endswith(")") and raw.count("(") < raw.count(")"):
            raw = raw[:-1]
            end -= 1
        core = _EXTENSION.sub("", raw) if "x" in raw else raw  # every extension word has x
        digits = sum(c.isdigit() for c in core)
        international = raw[0] == "+" or raw.startswith("00")
        if not 7 <= digits <= 15:
            continue
        if _DATE_LIKE.fullmatch(raw) or _SSN_SHAPE.fullmatch(raw) or _version_context(text, start):
            continue
        if not international:
            if _after_tax_label(text, start):
                continue  # p.iva 01234567890
            # the phone word before it: searched once, and only when asked (the slowest check)
            context: bool | None = None
            if digits < 9:
                context = words and _phone_context(text, start)
                if not context:
                    continue
            if "." in raw and raw.count(".") != 2 and not _FRENCH_DOTTED.fullmatch(raw):
                continue
            # bare groups of digits are too common (amounts, ids): a national number needs
            # a leading 0, parentheses, a North American shape or a phone word before it
            if core.isdigit() and not (
                (core[0] == "0" and len(core) >= 9) or _TEN_DIGITS.fullmatch(core)
            ):
                if context is None:
                    context = words and _phone_context(text, start)
                if not context:
                    continue  # bare digits: a phone only with a leading 0, 10 digits or a word
            if not (
                raw[0] == "0"
                or raw[0] == "("
                or _NORTH_AMERICAN.fullmatch(core)
                or _TEN_DIGITS.fullmatch(raw)
                or _CHINA_MOBILE.fullmatch(core)
                or _TRUNK_FIRST.fullmatch(core)
            ):
                if context is None:
                    context = words and _phone_context(text, start)
                if not context:
                    continue
        elif digits < 8 and not (
            words and _PHONE_WORD.search(case_fold(text[max(0, start - 40) : start]))
        ):
            continue  # +290 8999: seven digits in all only after a phone word
        yield Span(start, end, PHONE)


# Substrings without which a pattern cannot match: the scan is skipped (they are also marks
# of agent.redaction.prefilter, so most texts are not even searched for them).


def find_secrets(text: str, found: frozenset[str] | None = None) -> Iterator[Span]:
    found = marks(text) if found is None else found
    if "shape" in found:
        for m in shape_matches(text):
            start = m.start()
            if start and (text[start - 1].isalnum() or text[start - 1] == "_"):
                continue  # inside a longer word
            if text[start - 1 : start] == "-" and not text.startswith(
                ("AKIA", "ASIA", "-----"), start
            ):
                continue  # "-sk-..." is part of something else; "-AKIA..." and "-----" are not
            if m.lastgroup:  # the key only, not what shows where it is
                yield Span(*m.span(m.lastgroup), SECRET)
            else:
                yield Span(start, m.end(), SECRET)
    if "assigned" in found:
        lowered = case_fold(text)  # as re's IGNORECASE reads it: "PİN" holds "pin"
        if any(marker in lowered for marker in ASSIGNED_MARKERS):
            yield from _assigned(text, lowered)
    if "://" in text:
        for m in _URL_PASSWORD.finditer(text):
            yield Span(m.start(1), m.end(1), SECRET)
    if "token" in found:
        yield from _tokens(text)


def shape_matches(text: str) -> Iterator[re.Match[str]]:
    """``_SECRET_SHAPES.finditer(text)``, tried only where one of its shapes' heads starts
    (mark_words.SHAPE_HEADS, one RE2 pass): re would try seventy alternatives at every
    position. Short texts, or without RE2, are scanned whole."""
    starts = re2_starts("shape", text)
    if starts is None:
        return _SECRET_SHAPES.finditer(text)
    return finditer_from(_SECRET_SHAPES, text, starts)


def token_matches(text: str) -> Iterator[re.Match[str]]:
    """``_TOKEN.finditer(text)``, tried only where a run of 24 or more of its characters
    starts (a match starts a run: what is before it is none of them)."""
    starts = re2_starts("token", text)
    return _TOKEN.finditer(text) if starts is None else finditer_from(_TOKEN, text, starts)


# Tokens of known shapes that _looks_secret cannot tell from hex hashes or words: a Twilio
# account SID, a Mailchimp API key
_LOWER_KEY_TOKEN = re.compile(r"AC[0-9a-f]{32}|[0-9a-z]{32}-us\d{1,2}")
# What follows the first part of a Discord bot token (its timestamp and HMAC)
_DOTTED_TAIL = re.compile(r"\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,}(?![\w\-])")


def _tokens(text: str) -> Iterator[Span]:
    for m in token_matches(text):
        token = m.group()
        if _looks_secret(token):
            tail = _DOTTED_TAIL.match(text, m.end()) if text[m.end() : m.end() + 1] == "." else None
            yield Span(m.start(), tail.end() if tail else m.end(), SECRET)
        elif _LOWER_KEY_TOKEN.fullmatch(token):
            yield Span(m.start(), m.end(), SECRET)


def _looks_password(value: str) -> bool:
    """Letters and digits, and upper case or a symbol: not a word people write."""
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    has_upper = any(c.isupper() for c in value[1:])
    has_symbol = any(not c.isalnum() for c in value.rstrip(".,;:!?)"))
    return has_digit and has_alpha and (has_upper or has_symbol)


def assigned_matches(text: str) -> Iterator[re.Match[str]]:
    """``_SECRET_ASSIGNED.finditer(text)``, tried only where a keyword's root is (or the
    ``_`` before it)."""
    return finditer_from(_SECRET_ASSIGNED, text, keyword_starts(text, _ASSIGNED_ROOTS, 1))


def loose_password_matches(text: str) -> Iterator[re.Match[str]]:
    """``_LOOSE_PASSWORD.finditer(text)``, tried only where one of its words starts."""
    return finditer_from(_LOOSE_PASSWORD, text, keyword_starts(text, _LOOSE_ROOTS))


# What a password "is" or "was" in prose, not the password: "The password is required",
# "your password was incorrect" (lower-case words only; "is Required1!" is still a value).
# Words a real password rarely is, and a value's words are lost to the model when redacted.
_PASSWORD_STATES = frozenset(
    "required incorrect correct invalid wrong expired missing mandatory optional needed "  # noqa: SIM905
    "changed locked blocked disabled enabled accepted rejected encrypted hashed stored "
    "hidden visible protected secure insecure compromised leaked shared different "
    "identical simple complex longer shorter correctly incorrectly expiring missing "
    "unchanged updated outdated temporary forgotten generated case-sensitive "
    "case-insensitive mismatched unknown invalidated revoked rotated stolen".split()
)


def _prose_after_is(match: re.Match[str], value: str) -> bool:
    """A password word linked by "is"/"was" to a word of :data:`_PASSWORD_STATES` (and
    "not", "too", "still" before one are not values either)."""
    link = match.group(0)[: match.start(1) - match.start(0)].lower()
    if not (link.rstrip(" \t\"'").endswith((" is", " was")) and value.islower()):
        return False
    return value.rstrip(".,;:!?)") in _PASSWORD_STATES


def _assigned(text: str, folded: str) -> Iterator[Span]:
    """Assigned secrets, loose passwords, PINs, access codes and passwords on command lines;
    ``folded`` is ``case_fold(text)``."""
    for m in assigned_matches(text):
        value = m.group(1).rstrip(".")
        if value.startswith("<") or value.lower() in {"none", "null", "true", "false", "redacted"}:
            continue
        if _prose_after_is(m, value):
            continue
        link = m.group(0)[: m.start(1) - m.start(0)].lower()
        if link[:6] == "bearer" and value.lower() in _BEARER_PROSE:
            continue  # "bearer tokens", "Bearer authentication": prose, not a token
        by_sign_only = (link[:4] == "pass" and not link[4:5].isalpha()) or (
            link[:2] == "pw" and not link[2:3].isalpha()
        )
        if by_sign_only and (value.isalpha() or _after_ticket_word(folded, m.start())):
            continue  # "one pass: detectors", "Boarding pass: ABC123"
        if link.rstrip().rstrip("\"'").endswith("'s") and not (
            _looks_password(value) or _looks_key(value)
        ):
            continue  # "the API key's policy": a possessive, unless a password follows
        yield Span(m.start(1), m.start(1) + len(value), SECRET)
    if "pass" in folded:
        for m in _PASSPHRASE.finditer(text):
            if _PROSE_WORDS.isdisjoint(m.group(1).lower().split()):  # "reset it from ..."
                yield Span(m.start(1), m.end(1), SECRET)
    if "pin" in folded or "passcode" in folded or "geheimzahl" in folded:
        for m in _PIN.finditer(text):
            yield Span(m.start(1), m.end(1), SECRET)
    if any(word in folded for word in _ACCESS_CODE_WORDS):
        yield from _access_codes(text, folded)
    if "mysql" in folded or "mariadb" in folded or "sshpass" in folded:
        for m in _CLI_PASSWORD.finditer(text):
            group = 1 if m.group(1) else 2
            yield Span(m.start(group), m.end(group), SECRET)
    if _LOOSE_GATE.isdisjoint(words(text)):
        return
    for m in loose_password_matches(text):
        value = m.group(1).rstrip(".,;:!?)")
        if _looks_password(value) or _looks_key(value):
            yield Span(m.start(1), m.start(1) + len(value), SECRET)


def _after_ticket_word(folded: str, start: int) -> bool:
    before = folded[max(0, start - 16) : start].split()
    return bool(before) and before[-1] in _TICKET_PASSES


# A passphrase of words: "Password: correct horse battery staple", "passphrase: tiger lily
# moon" (three to six lower-case words to the end of the line, after a colon)
_PASSPHRASE = re.compile(
    r"(?i:\bpass(?:phrase|word)\s*[:=\uff1a]\s*)"
    r"([a-z]{2,20}(?:[ \t]+[a-z]{2,20}){2,5})[ \t]*[.!]?[ \t]*(?=\n|$)"
)


# Words of a sentence, which a passphrase of random words seldom holds
_PROSE_WORDS = frozenset(
    "the a an it to from of in on for and or is are be your you my with at by this that "  # noqa: SIM905
    "please then there here not no can will should must".split()
)


def _access_codes(text: str, folded: str) -> Iterator[Span]:
    """_ACCESS_CODE's values, tried only at the starts of the words in the 28 characters
    before each of its code words; the other codes of a recovery or backup codes list."""
    near = literal_starts(folded, _ACCESS_CODE_WORDS, 28)
    starts = [i for i in near if text[i].isalnum() and (i == 0 or not text[i - 1].isalnum())]
    for m in finditer_from(_ACCESS_CODE, text, starts):
        if sum(c.isdigit() for c in m.group(1)) < 3:
            continue  # "the door code is broken"
        yield Span(m.start(1), m.end(1), SECRET)
        if "recovery" in m.group(0).lower() or "backup" in m.group(0).lower():
            at = m.end(1)
            while (more := _NEXT_CODE.match(text, at)) and sum(
                c.isdigit() for c in more.group(1)
            ) >= 2:
                yield Span(more.start(1), more.end(1), SECRET)
                at = more.end()


def _looks_key(value: str) -> bool:
    """A key in lower case after an API-key or password word: letters and two digits or
    more (9f8e7d6c5b4a39281706, hunter22)."""
    return sum(c.isdigit() for c in value) >= 2 and any(c.isalpha() for c in value)


PATTERN_DETECTORS = (
    find_secrets,
    find_emails,
    find_ibans,
    find_cards,
    find_ssns,
    find_ips,
    find_phones,
)
