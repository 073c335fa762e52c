"""The words the redaction detectors look for that the prefilter's marks are built from
(agent/redaction/prefilter.py): here, so that the prefilter and the detectors both import
them and neither imports the other."""

from __future__ import annotations

# find_secrets: the known key shapes' prefixes, and the words of assigned secrets
SHAPE_MARKERS = ("-----BEGIN", "sk-", "sk_", "pk_", "rk_", "ef-", "ghp_", "gho_", "ghu_",
                 "ghs_", "ghr_", "github_pat_", "SG.", "npm_", "pypi-", "_v1_", "shp", "key-",
                 "whsec_", "SK",
                 "glpat-", "xox", "AKIA", "ASIA", "AIza", "hf_", "eyJ",
                 "gldt-", "glft-", "glsoat-", "glrt-", "glcbt-", "glimt-", "glptt-", "glagent-",
                 "gloas-", "GR1348941", "ABIA", "ACCA", "A3T", "hooks.slack.com",
                 "softlayer.com",
                 "dapi", "dkea", "dp.", "dt0", "duffel_", "fio-u-", "dnkey-", "glffct-",
                 "sat.", ".atlasv1.", "api_org_", "s-s4t2", "lin_", "NRAK-", "NRJS-", "NRII-",
                 "API-", "sha256~", "pscale_", "PMAK-", "pul-", "rdme_", "rubygems_", "xkeysib-",
                 "sntry", "sm_", "shippo_", "hvs.", "hvb.", "AAAAAAAAAAAAAAAAAAAAA",
                 "v1.0-", "A3-", "p8e-", "AGE-SECRET-KEY-1", "pat", "Q~", "sl.", "HRKU-AA",
                 "EAA", "live_", "test_", "tfp_", "access-", "pubkey-", "t1.", "AQVN",
                 "BUNDLE_", "_gitlab_session=")  # fmt: skip
ASSIGNED_MARKERS = ("key", "secret", "token", "pass", "pwd", "bearer", "pw", "pin", "kennwort",
                    # "password" in other languages (detectors._PASSWORD_WORDS), and PINs
                    "mdp", "contras", "senha", "wachtwoord", "hasło", "haslo", "heslo",
                    "lösenord", "losenord", "adgangskode", "salasana", "jelsz", "şifre",
                    "sifre", "parolă", "kata sandi", "mật khẩu", "mat khau", "пароль", "密码",
                    "密碼", "口令", "パスワード", "暗証番号", "비밀번호", "كلمة", "पासवर्ड",
                    "geheimzahl")  # fmt: skip

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
