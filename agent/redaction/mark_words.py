"""The words the redaction detectors look for that the prefilter's marks are built from
(agent/redaction/prefilter.py): here, so that the prefilter and the detectors both import
them and neither imports the other."""

from __future__ import annotations

# find_secrets: where each key shape of detectors._SECRET_SHAPES starts, in RE2's syntax
# (no lookarounds): the prefilter's "shape" mark, and the only places the shapes are tried.
# Each is what its shape's matches must start with (most a literal prefix, some a few
# character classes more where the prefix alone is an ordinary word: pat, test_, sl.).
SHAPE_HEADS = "|".join((
    r"-----BEGIN ", r"sk-", r"(?:rk|pk|sk)_(?:live|test)_", r"ef-[A-Za-z0-9]{4,}-",
    r"gh[pousr]_", r"github_pat_", r"xox[abposr]-", r"AIza", r"hf_", r"SG\.", r"npm_",
    r"(?:gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas|ffct)-|GR1348941)",
    r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}", r"pypi-", r"do[opr]_v1_",
    r"shp(?:at|ca|pa|ss)_", r"key-[a-z0-9]{32}", r"whsec_", r"SK[0-9a-fA-F]{32}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ", r"https://hooks\.slack\.com/", r"api\.softlayer\.com/",
    r"BUNDLE_(?:ENTERPRISE|GEMS)__CONTRIBSYS__COM", r"_gitlab_session=",
    r"(?:dapi|dkea)[a-f0-9]{32}", r"dp\.(?:pt|st|sa|ct|scim|audit)\.", r"dt0[a-z]\d{2}\.",
    r"duffel_(?:test|live)_", r"fio-u-", r"dnkey-", r"(?:pat|sat)\.[A-Za-z0-9_\-]{22}\.",
    r"[a-z0-9]{14}\.atlasv1\.", r"api_org_", r"s-s4t2(?:ud|af)-", r"lin_(?:api|oauth)_",
    r"NR(?:AK|JS|II)-", r"API-[A-Z0-9]{26}", r"sha256~", r"pscale_(?:tkn|oauth|pw)_",
    r"PMAK-", r"pul-[a-f0-9]{40}", r"rdme_", r"rubygems_", r"xkeysib-", r"sntry[us]_",
    r"sm_(?:aat|pat|sat)_", r"shippo_(?:live|test)_", r"hv[sb]\.", r"A{21}",
    r"v1\.0-[a-f0-9]{24}-", r"A3-[A-Z0-9]{6}-", r"p8e-[A-Za-z0-9]{32}", r"AGE-SECRET-KEY-1",
    r"pat[A-Za-z0-9]{14}\.", r"[A-Za-z0-9_~.]{3}\dQ~", r"sl\.[A-Za-z0-9\-=_]{130}",
    r"HRKU-AA", r"EAA[MC][A-Za-z0-9]{100}", r"(?:live|test)_(?:pub_)?[a-f0-9]{31}",
    r"tfp_", r"access-(?:sandbox|development|production)-", r"pubkey-[a-f0-9]{32}",
    r"t1\.[A-Za-z0-9_\-]+={0,2}\.[A-Za-z0-9_\-]{86}", r"AQVN",
))  # fmt: skip
# find_phones: the words before a phone number; those of scripts without spaces, or written
# before a compound (전화번호), are read without word boundaries; and the words for "number"
PHONE_WORDS = ("phone", "tel", "telephone", "mobile", "cell", "call", "ring", "text", "whatsapp",
               "fax", "telefon", "handy", "téléphone", "portable", "tél", "teléfono", "móvil",
               "telefono", "cellulare", "bel", "mob", "reach", "contact", "telp", "ponsel", "hp",
               "sđt", "điện thoại", "тел", "телефон", "звоните", "моб")  # fmt: skip
PHONE_WORDS_JOINED = ("电话", "電話", "手机", "手機", "携帯", "拨打", "撥打", "致电", "致電",
                      "连络", "聯絡", "联系", "聯繫", "お電話", "℡", "☎", "연락처", "전화",
                      "핸드폰", "휴대폰", "هاتف", "جوال", "फ़ोन", "फोन", "मोबाइल")  # fmt: skip
NUMBER_WORDS = ("number", "no.", "nr", "numero", "número", "numéro", "nummer", "numer", "номер")
ASSIGNED_MARKERS = ("key", "secret", "token", "pass", "pwd", "bearer", "pw", "pin", "kennwort",
                    # "password" in other languages (detectors._PASSWORD_WORDS), and PINs
                    "mdp", "contras", "senha", "wachtwoord", "hasło", "haslo", "heslo",
                    "lösenord", "losenord", "adgangskode", "salasana", "jelsz", "şifre",
                    "sifre", "parolă", "kata sandi", "mật khẩu", "mat khau", "пароль", "密码",
                    "密碼", "口令", "パスワード", "暗証番号", "비밀번호", "كلمة", "पासवर्ड",
                    "geheimzahl",
                    # access codes, security answers, passwords on command lines
                    "code", "otp", "cvv", "cvc", "csc", "combination", "digicode", "código",
                    "codice", "security", "mysql", "mariadb")  # fmt: skip

# names.py's compound street endings (German, Dutch, Scandinavian, Finnish), as one
# alternation and as words
COMPOUND_ENDINGS = (
    "straße|strasse|str\\.|weg|gasse|allee|platz|ring|damm|ufer|chaussee|steig|pfad|markt|"
    "straat|laan|singel|gracht|plein|dreef|kade|hof|pad|steeg|dijk|baan|park|boulevard|"
    "gatan|gata|gate|gade|vägen|väg|vegen|veien|vej|torget|torg|torv|plads|stræde|gränd|"
    "katu|tie|kuja|tori"
)
ENDING_WORDS = [e.replace("\\", "") for e in COMPOUND_ENDINGS.split("|")]

# names.py: the ward and district words of South-East Asian addresses
ADMIN_UNIT = (
    r"(?:Quận|Q\.|Phường|P\.|Huyện|Xã|Thị xã|District|Ward|Barangay|Brgy\.?|Kecamatan|Kec\.|"
    r"Kelurahan|Kel\.|Sector|Khet|Khwaeng|Amphoe|Tambon|Moo)"
)
