"""The semantic cache's lexical guard: what two prompts close in meaning must still share.

An embedding puts "enable dark mode" next to "disable dark mode", "order 48213" next to
"order 48231" and "Salesforce" next to "HubSpot". Before a cached answer is served for a
reworded prompt, :func:`refusal` compares the two prompts' :class:`Signature` and names the
first thing that differs:

- ``number``: numbers, number words ("two" is 2, "first" is 1st) and amounts;
- ``date``: weekdays, months, clock times, years;
- ``negation``: one prompt negates ("not", "don't", "without", "avoid"), the other not;
- ``antonym``: one prompt has a word, the other its opposite (on/off, add/remove, ...),
  or the same word with a negating prefix (safe/unsafe);
- ``entity``: capitalized names (not a sentence's first word), all-caps acronyms and
  possessives ("my colleague's");
- ``direction``: what comes after "from", "to", "into" differs (savings to current);
- ``url`` and ``code``: links, paths, identifiers (snake_case, camelCase, dotted, calls);
- ``swap``: a content word replaced by another that is not a misspelling of it (nor a
  synonym in a short table, "cancel"/"end", "shop"/"store", nor a light verb of getting,
  "obtain"/"receive"/"request"/"offer", dropped as "get" is);
- ``qualifier``: one prompt adds content words the other lacks (a narrower question).

:func:`time_sensitive` is separate: a prompt about "today" or "the latest" never hits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "GUARD_REASONS",
    "Signature",
    "misspelt_repeat",
    "refusal",
    "signature",
    "time_sensitive",
]

GUARD_REASONS = (
    "number",
    "date",
    "negation",
    "antonym",
    "entity",
    "direction",
    "url",
    "code",
    "swap",
    "qualifier",
)

_TIME_SENSITIVE = re.compile(
    r"\b(today|today's|tonight|tomorrow|yesterday|now|right now|currently|current|latest|"
    r"newest|recent|recently|at the moment|this (?:morning|afternoon|evening|week|weekend|"
    r"month|year)|next (?:week|month|year)|last (?:week|month|year|night)|nowadays|these days|"
    r"live (?:scores?|streams?|results|updates|feeds?|traffic|coverage|news|odds|prices|data)|"
    r"breaking|so far|up to date|up-to-date)\b",
    re.IGNORECASE,
)


# "current" of a bank account is not a time, nor the asker's own current one ("my current
# mortgage deal": theirs, whenever it is asked)
_NOT_TIME = re.compile(
    r"\bcurrent accounts?\b|\b(?:my|our|your|his|her|their) current\b", re.IGNORECASE
)


def _words(text: str) -> list[str]:
    return text.split()


# A bare domain starts only where a token starts (not after a letter, dot or dash inside
# one): from every dot of "a.a.a..." the search backtracked to the end again, 50-90 ms
# for 2,000 characters on the event loop; now one try per token (the same matches on every
# string of fow-cache's data).
_URL = re.compile(r"\b(?:https?://|www\.)\S+|(?<![\w.-])\b[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|"
                  r"io|dev|co\.uk|uk|gov|edu|ai|app)\b(?:/\S*)?", re.IGNORECASE)  # fmt: skip
_CODE = re.compile(
    r"`[^`]+`"  # a code span
    r"|\b[A-Za-z_]\w*\(\)?"  # a call: name( or name()
    r"|\b\w+(?:\.\w+)+\b"  # dotted: os.path.join, file.py, 3.11
    r"|\b[a-z]+_\w+\b|\b_\w+\b"  # snake_case, _private
    r"|\b[a-z]+[A-Z]\w*\b"  # camelCase
    r"|(?:^|\s)--?[a-zA-Z][\w-]*"  # --flags
    r"|(?:^|\s)[~.]?/[\w./-]+"  # paths
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'\u2019-]*|\d+(?:[.,:]\d+)*(?:st|nd|rd|th|[a-zA-Z%]+)?|[£$€%]")

_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        _words(
            """
            zero one two three four five six seven eight nine ten eleven twelve thirteen
            fourteen fifteen sixteen seventeen eighteen nineteen twenty
            """
        )
    )
}
_NUMBER_WORDS.update(
    {
        "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70",
        "eighty": "80", "ninety": "90", "hundred": "100", "thousand": "1000",
        "million": "1000000", "billion": "1000000000", "dozen": "12", "half": "0.5",
        "quarter": "0.25", "once": "1x", "twice": "2x", "single": "1", "double": "2",
        "triple": "3", "couple": "2", "pair": "2", "none": "0",
        # ordinals as their value, as "1st" and "3rd" are read: "first" and "1st" agree
        "first": "1", "second": "2", "third": "3", "fourth": "4", "fifth": "5",
        "sixth": "6", "seventh": "7", "eighth": "8", "ninth": "9", "tenth": "10",
    }
)  # fmt: skip
# "which one", "a single egg", "single person discount": too often not a count ("a" is one
# too: "one egg" and "a single egg" agree)
del _NUMBER_WORDS["one"]
del _NUMBER_WORDS["single"]
# a unit written after a number, as one form ("2kg", "2 kilo" and "two kilos" agree;
# "15%", "15 %" and "fifteen percent" agree; "10GB" and "10MB" do not)
_UNITS = {
    unit: group[0]
    for group in (
        ("%", "percent"),
        ("kg", "kgs", "kilo", "kilos", "kilogram", "kilograms"),
        ("g", "gram", "grams", "gr"),
        ("lb", "lbs"),
        ("km", "kms", "kilometre", "kilometres", "kilometer", "kilometers"),
        ("mi", "mile", "miles"),
        ("gb", "gig", "gigs", "gigabyte", "gigabytes"),
        ("mb", "megabyte", "megabytes", "meg", "megs"),
        ("tb", "terabyte", "terabytes"),
        ("min", "mins", "minute", "minutes"),
        ("h", "hr", "hrs", "hour", "hours"),
        ("d", "day", "days"),
        ("wk", "wks", "week", "weeks"),
        ("mo", "month", "months"),
        ("y", "yr", "yrs", "year", "years"),
    )
    for unit in group
}
_DAYS = _words("monday tuesday wednesday thursday friday saturday sunday")
_MONTHS = _words(
    "january february march april may june july august september october november december"
)
_DATE_WORDS = {
    **{d: d[:3] for d in _DAYS},
    **{d[:3]: d[:3] for d in _DAYS},
    **{m: m[:3] for m in _MONTHS},
    "weekend": "weekend", "weekday": "weekday", "weekdays": "weekday", "weekends": "weekend",
    "morning": "morning", "afternoon": "afternoon", "evening": "evening", "night": "night",
    "midnight": "midnight", "noon": "noon", "midday": "noon", "christmas": "christmas",
    "easter": "easter", "spring": "spring", "summer": "summer", "autumn": "autumn",
    "winter": "winter", "daily": "daily", "weekly": "weekly",
    "monthly": "monthly", "yearly": "yearly", "annual": "yearly", "annually": "yearly",
}  # fmt: skip
# "am" and "pm" are a time only after a number ("7 pm" is "7pm"; "I am" is not a time)
_CLOCK = {"am", "pm"}
# "may" and "march" are also verbs: counted as dates only with a capital (see signature)
_AMBIGUOUS_MONTHS = {"may", "march"}
_NEGATIONS = {
    "not", "no", "never", "without", "nothing", "nobody", "nowhere", "neither", "nor",
    "cannot", "avoid", "except", "excluding", "unable", "stop", "prevent", "refuse",
    # typed without the apostrophe
    "dont", "cant", "wont", "isnt", "arent", "doesnt", "didnt", "wasnt", "werent",
    "shouldnt", "couldnt", "wouldnt", "havent", "hasnt",
}  # fmt: skip
_ANTONYMS = [
    ("on", "off"), ("enable", "disable"), ("enabled", "disabled"), ("activate", "deactivate"),
    ("open", "closed"), ("open", "close"), ("opening", "closing"), ("start", "stop"),
    ("start", "end"), ("begin", "end"), ("add", "remove"), ("add", "delete"),
    ("include", "exclude"), ("included", "excluded"), ("includes", "excludes"),
    ("increase", "decrease"), ("increased", "decreased"), ("increase", "reduce"),
    ("increase", "less"), ("decrease", "more"), ("reduce", "more"),
    ("raise", "lower"), ("up", "down"), ("upgrade", "downgrade"), ("in", "out"),
    ("into", "out"), ("login", "logout"), ("import", "export"), ("upload", "download"),
    ("send", "receive"), ("sent", "received"), ("incoming", "outgoing"),
    ("inbound", "outbound"), ("input", "output"), ("buy", "sell"), ("lend", "borrow"),
    ("deposit", "withdraw"), ("join", "leave"), ("arrive", "depart"),
    ("arrival", "departure"), ("arrivals", "departures"), ("before", "after"),
    ("above", "below"), ("over", "under"), ("more", "less"), ("more", "fewer"),
    ("most", "least"), ("max", "min"), ("maximum", "minimum"), ("high", "low"),
    ("higher", "lower"), ("highest", "lowest"), ("early", "late"), ("earlier", "later"),
    ("earliest", "latest"), ("first", "last"), ("fast", "slow"), ("hot", "cold"),
    ("warm", "cold"), ("light", "dark"), ("big", "small"), ("large", "small"),
    ("long", "short"), ("heavy", "light"), ("cheap", "expensive"), ("cheapest", "priciest"),
    ("safe", "dangerous"), ("true", "false"), ("yes", "no"), ("win", "lose"),
    ("pass", "fail"), ("positive", "negative"), ("benefits", "drawbacks"),
    ("advantages", "disadvantages"), ("pros", "cons"), ("male", "female"), ("men", "women"),
    ("man", "woman"), ("boy", "girl"), ("husband", "wife"), ("mother", "father"),
    ("son", "daughter"), ("left", "right"), ("north", "south"), ("east", "west"),
    ("public", "private"), ("internal", "external"), ("domestic", "international"),
    ("new", "old"), ("newer", "older"), ("young", "old"), ("younger", "older"),
    ("adult", "child"), ("adults", "children"), ("adult", "children"), ("adults", "kids"),
    ("full", "part"), ("single", "married"), ("day", "night"), ("plus", "minus"),
    ("add", "subtract"), ("multiply", "divide"), ("encrypt", "decrypt"),
    ("install", "uninstall"), ("subscribe", "unsubscribe"), ("lock", "unlock"),
    ("show", "hide"), ("pause", "resume"), ("gain", "lose"), ("profit", "loss"),
    ("credit", "debit"), ("income", "expense"), ("ascending", "descending"),
    ("asc", "desc"), ("vertical", "horizontal"), ("row", "column"), ("rows", "columns"),
    ("inner", "outer"), ("upper", "lower"), ("uppercase", "lowercase"), ("push", "pull"),
    ("read", "write"), ("client", "server"), ("sync", "async"), ("static", "dynamic"),
    ("mutable", "immutable"), ("inside", "outside"), ("employee", "employer"),
    ("landlord", "tenant"), ("buyer", "seller"), ("sender", "recipient"),
    ("parent", "child"), ("teacher", "student"), ("accept", "reject"), ("allow", "block"),
    ("allow", "deny"), ("allowed", "banned"), ("legal", "illegal"), ("permitted", "forbidden"),
    ("free", "paid"), ("online", "offline"), ("wet", "dry"),
    ("winner", "loser"), ("accept", "decline"), ("cover", "exclude"), ("covered", "excluded"),
    ("allow", "ban"), ("spicy", "mild"), ("within", "after"), ("within", "outside"),
    ("same", "next"), ("same", "different"), ("member", "non-member"), ("with", "without"),
    ("employed", "self-employed"), ("agree", "disagree"), ("like", "dislike"),
    ("best", "worst"), ("better", "worse"), ("good", "bad"),
    ("right", "wrong"), ("correct", "incorrect"), ("valid", "invalid"), ("maximise", "minimise"),
    ("maximize", "minimize"), ("connect", "disconnect"), ("mount", "unmount"),
    ("freeze", "unfreeze"), ("block", "unblock"), ("follow", "unfollow"), ("pin", "unpin"),
    ("archive", "unarchive"), ("hire", "fire"), ("rise", "fall"), ("buying", "selling"),
]  # fmt: skip
_OPPOSITE: dict[str, set[str]] = {}
for _a, _b in _ANTONYMS:
    _OPPOSITE.setdefault(_a, set()).add(_b)
    _OPPOSITE.setdefault(_b, set()).add(_a)
_NEG_PREFIXES = ("un", "in", "im", "il", "ir", "dis", "non", "non-", "anti")
_CONTRACTIONS_NOT_POSSESSIVE = {
    "it's", "what's", "that's", "there's", "here's", "who's", "where's", "how's", "let's",
    "he's", "she's", "when's", "why's", "which's",
}  # fmt: skip
# (stay and remain among them: as copulas they ask what "be" asks, "does it stay open")
_STOPWORDS = set(
    _words(
        """
        a an the and or but if then so of in on at to for from by with about as into onto
        over under is are was were be been being am do does did done doing have has had
        having will would shall should can could may might must i me my mine we us our ours
        you your yours he him his she her hers it its they them their theirs this that
        these those there here what which who whom whose when where why how whether any
        some all each every much many more most other such own same than too very just also
        only still even ever again get got gets getting go goes going way need needs want
        wants like would'd i'm i'd i've i'll you're we're they're it's what's that's
        there's can't don't isn't aren't won't please thanks thank hi hello hey hiya
        morning er uh um so ok okay yeah yes well actually cheers quick question possible
        able anything something let know tell give make use one single s t whats thats theres hows
        wheres whens whos im ive youre
        stay stays stayed staying remain remains remained remaining
        """
    )
)
_DIRECTIONS = {"from", "to", "into", "than", "vs", "versus"}
#: at most this many content words replaced or added: a narrow edit (a trap), not a rewording
_SMALL_EDIT = 2
_FILLER = {
    "please", "thanks", "thank", "hi", "hello", "hey", "hiya", "er", "uh", "um", "wondering",
    "team", "advance", "folk", "guy", "whats", "hows", "wheres", "whens", "whos",
    "wonder", "available", "needed",  # "is X available" asks what "is there X" asks
    # apologies and hedges ask nothing: "Sorry to bother you, but how do I ...", "how long
    # does it usually take"
    "sorry", "bother", "silly", "excuse", "usually", "typically", "normally", "generally",
}  # fmt: skip
# words that carry nothing of a question, left out where a repeat is compared word by word
_DISCOURSE = {"so", "um", "uh", "er", "erm", "ok", "okay", "oh", "hmm"}
# a word and its derived forms are one word ("wireless"/"wirelessly", "quote"/"quotation",
# "form"/"formation", "pay"/"payment"); these suffixes only, from a stem of 3 letters or
# more ("er"/"or" are not among them: "employ"/"employer", "drive"/"driver")
_DERIVATIONS = ("ly", "ing", "ed", "ion", "ation", "ition", "ment", "ments")
# Content words that mean the same in a question, compared as one (a swap of one for the
# other is a rewording, not another question). Light verbs of getting ("obtain",
# "receive") are dropped as "get" is (a stopword).
_SYNONYMS = {
    word: group[0]
    for group in (
        ("cancel", "end", "terminate"),
        ("shop", "store"),
        ("road", "street"),
        ("fast", "quick"),
        ("faster", "quicker"),
        ("fastest", "quickest"),
        ("previou", "earlier", "prior"),  # "previous" after _stem
        ("create", "setup"),
        ("include", "contain"),
        ("price", "cost", "fee"),
        ("buy", "purchase"),
        ("fix", "repair"),
        ("change", "modify", "amend", "edit"),
        ("delete", "remove", "erase"),
        ("start", "begin"),
        ("choose", "pick", "select"),
        ("child", "children", "kid"),
        ("phone", "mobile", "telephone"),
        ("document", "paperwork"),
        ("trip", "journey"),
        ("obtain", "receive", "request", "order", "offer", "provide"),
    )
    for word in group
}
_LIGHT = {"obtain"}  # as "get" or "do" ("do you offer X", "how do I order X"): dropped
# phrases read as one word before anything else
_PHRASES = [
    (re.compile(r"\bset(?:ting)?[ -]up\b", re.IGNORECASE), "setup"),
    (re.compile(r"\bcomes? with\b", re.IGNORECASE), "include"),
]
# a greeting that opens a prompt ("Morning!", "Good evening,") is not a time of day
_GREETING = re.compile(r"^\W*(?:good\s+)?(?:morning|afternoon|evening)\b\W*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Signature:
    """What of a prompt must agree with a cached prompt's for a semantic hit."""

    numbers: frozenset[str]
    dates: frozenset[str]
    negated: bool
    words: frozenset[str]  # lower-cased word forms, for antonyms and prefixes
    entities: frozenset[str]
    urls: frozenset[str]
    code: frozenset[str]
    content: frozenset[str]  # content words (no stopwords, no numbers), light stems
    entity_order: tuple[str, ...]  # the entities in the order they appear
    directions: tuple[tuple[str, str], ...]  # (from|to|into|than|vs, the next content word)
    date_forms: frozenset[tuple[str, str]] = frozenset()  # (the word as written, its date)
    flows: frozenset[tuple[str, str]] = frozenset()  # every (from|to|into, next content word)
    sequence: tuple[str, ...] = ()  # every word in order, lower case, no filler


def time_sensitive(text: str) -> bool:
    """The answer depends on when it is asked ("today", "latest", "now", ...)."""
    return _TIME_SENSITIVE.search(_NOT_TIME.sub(" ", text)) is not None


def _stem(word: str) -> str:
    for suffix in ("ies", "es", "s"):
        if suffix == "s" and word.endswith(("ss", "us", "is")):
            break  # not a plural: wireless, process, famous, status, analysis
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def signature(text: str) -> Signature:
    """The guard's view of one prompt (computed once per entry and per lookup)."""
    text = _GREETING.sub("", text)
    for phrase, word in _PHRASES:
        text = phrase.sub(word, text)
    urls = frozenset(m.group(0).rstrip(".,;:!?)").lower() for m in _URL.finditer(text))
    without_urls = _URL.sub(" ", text)
    code = frozenset(m.group(0).strip() for m in _CODE.finditer(without_urls))
    code = frozenset(c for c in code if not re.fullmatch(r"[\d.]+", c))  # 3.5: a number
    numbers: set[str] = set()
    dates: set[str] = set()
    date_forms: set[tuple[str, str]] = set()
    entities: set[str] = set()
    words: set[str] = set()
    content: set[str] = set()
    negated = False
    order: list[str] = []
    directions: list[tuple[str, str]] = []
    preposition = ""
    sentence_start = True
    after_number = ""  # the previous token's value when it was a number without a unit
    sequence: list[str] = []
    for match in _WORD.finditer(without_urls.replace("\u2019", "'")):
        token = match.group(0)
        low = token.lower()
        if low not in _FILLER and low not in _DISCOURSE:
            sequence.append(low)
        start = sentence_start
        tail = without_urls[match.end() : match.end() + 1]
        sentence_start = tail in {".", "?", "!"}
        previous_number, after_number = after_number, ""
        if token[0].isdigit():
            digits = re.match(r"[\d.,:]+", token)
            assert digits is not None
            value = digits.group(0).replace(",", "").rstrip(".:")
            unit = low[digits.end() :]
            if ":" in value or unit in _CLOCK:
                dates.add(value + unit)
            elif len(value) == 4 and value.startswith(("19", "20")) and not unit:
                dates.add(value)
            elif unit in {"", "st", "nd", "rd", "th"}:
                numbers.add(value)
                after_number = value
            else:
                numbers.add(value + _UNITS.get(unit, unit))
            continue
        if previous_number and (low in _CLOCK or low in _UNITS or token == "%"):
            # "7 pm", "2 kilos", "15 %", "fifteen percent": the number's time or unit
            numbers.discard(previous_number)
            if low in _CLOCK:
                dates.add(previous_number + low)
            else:
                numbers.add(previous_number + _UNITS.get(low, low))
            continue
        if token in {"£", "$", "€", "%"} or _UNITS.get(low) == "%":
            numbers.add("%" if _UNITS.get(low) == "%" else token)
            continue
        if low.endswith("n't") or low in _NEGATIONS or low.startswith("non-"):
            negated = True
        base = low.removesuffix("'s").removesuffix("'")
        head, _, rest = low.partition("-")
        if low in _NUMBER_WORDS or (rest and head in _NUMBER_WORDS and rest in _UNITS):
            # "two", "two-year" (as "2-year" is read: 2 and its unit)
            value = _NUMBER_WORDS[head if rest else low]
            if rest:
                numbers.add(value + _UNITS[rest])
                continue
            else:
                numbers.add(value)
                after_number = value
        elif base in _DATE_WORDS or _stem(base) in _DATE_WORDS:
            if base in _AMBIGUOUS_MONTHS and token[0].islower():
                pass
            else:
                date = _DATE_WORDS.get(base) or _DATE_WORDS[_stem(base)]
                dates.add(date)
                date_forms.add((base, date))
                continue
        words.add(low)
        for part in re.split(r"[-']", low):
            if part:
                words.add(part)
        if low.endswith("'s") and low not in _CONTRACTIONS_NOT_POSSESSIVE and token[0].islower():
            entities.add(low)  # whose: "my colleague's password"
        if (
            token[0].isupper()
            and (not start or token.isupper())
            and not (len(token) == 1 or low in _STOPWORDS)
        ):
            entities.add(base)
            if base not in order:
                order.append(base)
        if low in _DIRECTIONS:
            preposition = low
        elif (
            base not in _STOPWORDS
            and low not in _NUMBER_WORDS
            and low not in _NEGATIONS  # compared as negation, not as a word
            and not low.endswith("n't")
            and len(base) > 1
        ):
            # "non-members" is "not ... members": the negation is compared as negation
            stem = _content_form(base.removeprefix("non-").replace("-", ""))
            if stem not in _LIGHT:
                content.add(stem)
            if preposition:
                directions.append((preposition, _stem(base)))
                preposition = ""
    return Signature(
        numbers=frozenset(numbers),
        dates=frozenset(dates),
        negated=negated,
        words=frozenset(words),
        entities=frozenset(entities),
        urls=urls,
        code=code,
        content=frozenset(content),
        entity_order=tuple(order),
        directions=tuple(sorted(directions)) if any(p == "from" for p, _ in directions) else (),
        date_forms=frozenset(date_forms),
        flows=frozenset(directions),
        sequence=tuple(sequence),
    )


def _content_form(word: str) -> str:
    """A content word as compared: light stem ("waiting" and "wait" agree), synonyms as
    one."""
    stem = _stem(word)
    if len(stem) >= 6 and stem.endswith("ing"):
        stem = stem[:-3]
        if len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "aeiouls":
            stem = stem[:-1]  # "running": "run"
    return _SYNONYMS.get(stem, stem)


def _typo(a: str, b: str, limit: int | None = None) -> bool:
    """``b`` is a misspelling of ``a`` (or a spelling variant: centre/center)."""
    if abs(len(a) - len(b)) > 2 or min(len(a), len(b)) < 4:
        return False
    # Damerau-Levenshtein, optimal string alignment
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    if limit is None:
        limit = 1 if max(len(a), len(b)) <= 5 else 2
    return prev[len(b)] <= limit


def _antonym(a: frozenset[str], b: frozenset[str]) -> bool:
    only_a, only_b = a - b, b - a
    for word in only_a:
        if _OPPOSITE.get(word, set()) & only_b:
            return True
        for prefix in _NEG_PREFIXES:
            if prefix + word in only_b or (
                word.startswith(prefix) and word[len(prefix) :] in only_b
            ):
                return True
    return False


def misspelt_repeat(cached: Signature, asked: Signature) -> bool:
    """The asked prompt is the cached one with some words misspelt ("How do I chnage the
    email adress on my acount?"): the same words in the same order, each the same or a
    misspelling of it, filler aside. A misspelt word is an unknown one to an embedding
    model (its cosine falls to 0.6 where a rewording keeps 0.9): this tier is for those,
    and :func:`refusal` still reads both."""
    if len(cached.sequence) != len(asked.sequence) or cached.sequence == asked.sequence:
        return False
    return all(
        a == b or _misspelling(a, b) for a, b in zip(cached.sequence, asked.sequence, strict=True)
    )


def _misspelling(a: str, b: str) -> bool:
    """``b`` misspells ``a``: letters only (no number is a misspelling of another), not
    its opposite (increase/decrease), nor it with a negating prefix (lock/unlock)."""
    if not (a.isalpha() and b.isalpha()) or b in _OPPOSITE.get(a, ()):
        return False
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    if any(long == prefix + short for prefix in _NEG_PREFIXES):
        return False
    return _typo(a, b)


def _derived(a: str, b: str) -> bool:
    """One word is the other with a derivational suffix ("quote", "quotation")."""
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    stem = short[:-1] if short.endswith("e") else short
    return len(stem) >= 3 and any(long == stem + suffix for suffix in _DERIVATIONS)


def _unmatched(mine: set[str], theirs: set[str]) -> set[str]:
    return {w for w in mine if not any(_typo(w, t) or _derived(w, t) for t in theirs)}


def _misspelt_dates(mine: Signature, theirs: Signature) -> bool:
    """Every date only ``mine`` has is written in ``theirs`` misspelt ("Mondays" and
    "Mondys"): the same date, not another."""
    missing = mine.dates - theirs.dates
    return all(
        any(
            _misspelt(form, word)
            for form, d in mine.date_forms
            if d == date
            for word in theirs.words
        )
        for date in missing
    )


def _misspelt(form: str, word: str) -> bool:
    """``word`` is ``form`` with one letter wrong, missing, added or swapped ("mondys";
    not "month" for "monthly", nor "sundays" for "mondays")."""
    return form != word and _typo(form, word, limit=1)


def _misspelt_date_words(words: set[str], theirs: Signature) -> set[str]:
    """The words that misspell a date ``theirs`` has ("mondy" of "Mondays")."""
    return {
        word
        for word in words
        for form, _ in theirs.date_forms
        if _misspelt(form, word) or _misspelt(_stem(form), word)
    }


def _source_and_destination(mine: Signature, theirs: Signature) -> bool:
    """What one prompt moves something from, the other moves it to (or into)."""
    sources = {w for p, w in mine.flows if p == "from"}
    return bool(sources & {w for p, w in theirs.flows if p in {"to", "into"}})


def refusal(cached: Signature, asked: Signature) -> str | None:
    """Why a cached prompt must not answer the asked one (a reason of
    :data:`GUARD_REASONS`), or None when nothing the guard reads differs."""
    if cached.numbers != asked.numbers:
        return "number"
    if cached.dates != asked.dates and not (
        _misspelt_dates(cached, asked) and _misspelt_dates(asked, cached)
    ):
        return "date"
    if cached.negated != asked.negated:
        return "negation"
    if _antonym(cached.words, asked.words):
        return "antonym"
    if _entities_differ(cached, asked) or _entities_differ(asked, cached):
        return "entity"
    if (
        set(cached.entity_order) == set(asked.entity_order)
        and cached.entity_order != asked.entity_order
    ):
        return "entity"  # "Word to PDF", "PDF to Word"
    if cached.directions and asked.directions and cached.directions != asked.directions:
        return "direction"  # "from savings to current", "from current to savings"
    if _source_and_destination(cached, asked) or _source_and_destination(asked, cached):
        return "direction"  # "move money to savings", "move money from savings"
    if cached.urls != asked.urls:
        return "url"
    if cached.code != asked.code:
        return "code"
    only_cached = _unmatched(set(cached.content - asked.content), set(asked.content))
    only_asked = _unmatched(set(asked.content - cached.content), set(cached.content))
    only_cached -= _FILLER | _misspelt_date_words(only_cached, asked)
    only_asked -= _FILLER | _misspelt_date_words(only_asked, cached)
    if only_cached and only_asked:
        if len(only_cached) <= _SMALL_EDIT and len(only_asked) <= _SMALL_EDIT:
            return "swap"
    elif 0 < len(only_cached | only_asked) <= _SMALL_EDIT:
        return "qualifier"
    return None


def _entities_differ(mine: Signature, theirs: Signature) -> bool:
    """A name in ``mine`` that ``theirs`` does not have, in any case ("UK" and "uk" agree)."""
    for entity in mine.entities:
        base = entity.removesuffix("'s")  # a possessive: "child's" and "childs" agree
        forms = {entity, base, base + "'s", base + "s"}
        if not forms & (theirs.words | theirs.entities) and not any(
            _misspelt(form, entity) for form, _ in theirs.date_forms
        ):  # a capitalised misspelt date ("on Mondys") is that date, not a name
            return True
    return False
