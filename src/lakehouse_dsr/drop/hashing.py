"""DROP's standardization and hashing of identifiers, as Spark column expressions.

DROP (California's Delete Request and Opt-out Platform) sends no identifier, only
base64(sha256(utf8(standardized value))); a composite list (NDZ, NameVIN) hashes each field so, joins
the Base64 strings in a fixed order without separator and hashes that again. The broker hashes its own
records the same way and joins. Everything here is a Column: the lake's identifiers are standardized
and hashed where they are, inside Spark, and no plaintext reaches the driver. A value that is empty
or invalid after standardization (a MAID that is not 32 hex digits, say) gets no hash (null), never
the hash of an empty string.

Cost: string functions evaluated per row in the JVM; names alone go through a Python UDF (Unicode
normalization, transliteration) unless the caller knows them to be ASCII (`names_ascii`), where
Spark's own functions give the same result: sending every row to a Python worker tripled the cost
of hashing a 10M-row NDZ table (70 s against 23 s); drop/matching.py sends only the others.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Literal

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, StringType, TimestampNTZType, TimestampType

from .lists import LISTS

FIELDS = ("email", "phone", "maid", "ctvid", "vin", "first_name", "last_name", "dob", "zip")

# Letters the name rule transliterates or folds to Latin (lowercase; anything not listed and not a
# letter or digit is dropped; letters of other scripts stay). Cyrillic after the common romanization
# (Ё -> yo, Щ -> shch), Greek letter by letter (ISO 843's simple cases), Latin letters that do not
# decompose to a plain one. Other accented Latin letters lose their marks by decomposition.
_TRANSLITERATION = {
    **dict(zip("абвгдезийклмнопрстуфыэ", "abvgdeziyklmnoprstufye", strict=True)),
    "ё": "yo", "ж": "zh", "х": "kh", "ц": "ts", "ч": "ch", "ш": "sh", "щ": "shch", "ъ": "", "ь": "", "ю": "yu",
    "я": "ya", "і": "i", "ї": "yi", "є": "ye", "ґ": "g", "ў": "u", "ј": "j", "љ": "lj", "њ": "nj", "џ": "dz",
    **dict(zip("αβγδεζηικλμνξοπρστυφω", "avgdeziiklmnxoprstyfo", strict=True)),
    "θ": "th", "χ": "ch", "ψ": "ps", "ς": "s",
    "ß": "ss", "æ": "ae", "œ": "oe", "ø": "o", "ł": "l", "đ": "d", "ð": "d", "þ": "th", "ı": "i", "ħ": "h",
    "ŀ": "l", "ŧ": "t", "ĸ": "k",
}


def standardized_name(value: str | None) -> str | None:
    """A first or last name as DROP standardizes it: Unicode-normalized, lowercase, Greek and Cyrillic
    transliterated, accents and marks dropped (`_folded`), letters and digits only (spaces, hyphens,
    apostrophes go: "Juan Pablo" -> "juanpablo"). None when nothing is left.
    Spark runs it in its Python workers (`_NAME`): no plaintext reaches the driver."""
    if value is None:
        return None
    folded = "".join(_folded(c) for c in unicodedata.normalize("NFC", value).lower())
    return unicodedata.normalize("NFC", "".join(c for c in folded if c.isalnum())) or None


def _folded(letter: str) -> str:
    """A listed letter's Latin spelling (й -> y before й could come apart into и and a breve); any
    other comes apart (NFKD: é -> e and an accent, ώ -> ω and a tonos) and its parts are looked up."""
    spelled = _TRANSLITERATION.get(letter)
    if spelled is not None:
        return spelled
    return "".join(_TRANSLITERATION.get(part, part) for part in unicodedata.normalize("NFKD", letter))


_NAME = F.udf(standardized_name, StringType())

# Date-of-birth strings the DOB rule reads (the spec leaves the formats to the broker), each by shape
# first so that no parser sees a string of another shape.
_DOB_SHAPES = ((r"^\d{4}-\d{1,2}-\d{1,2}$", "yyyy-M-d"), (r"^\d{8}$", "yyyyMMdd"),
               (r"^\d{1,2}/\d{1,2}/\d{4}$", "M/d/yyyy"), (r"^[A-Za-z]+ \d{1,2}, \d{4}$", "MMMM d, yyyy"),
               (r"^[A-Za-z]{3} \d{1,2}, \d{4}$", "MMM d, yyyy"))


_TEXT = StringType()


@dataclass(frozen=True)
class Rules:
    """The choices the spec leaves open (../shared/DROP.md marks them UNCONFIRMED).

    `zip_plus4`: how a ZIP+4 is told apart before its +4 is dropped: `nine_digits` (the value's
    letters and digits are exactly nine digits: "913041234" and "91304-1234") or `hyphenated` (the
    value reads ddddd-dddd). Both reproduce every published vector; they differ for nine-digit values
    without a hyphen."""

    zip_plus4: Literal["nine_digits", "hyphenated"] = "nine_digits"


def _nonempty(value: Column) -> Column:
    return F.when(F.length(value) > 0, value)


NAME_FIELDS = ("first_name", "last_name")


def names_ascii(values: Mapping[str, Column]) -> Column | None:
    """True where every name field of `values` ({field: Column}) is ASCII or null (its UTF-8 bytes are
    as many as its characters: no regular expression); None when `values` has no name field."""
    names = [values[f].cast("string") for f in NAME_FIELDS if f in values]
    if not names:
        return None
    return reduce(lambda a, b: a & b, [F.coalesce(F.octet_length(n) == F.length(n), F.lit(True)) for n in names])


def standardized(field: str, value: Column, data_type: DataType = _TEXT, rules: Rules | None = None,
                 ascii_names: bool = False) -> Column:
    """`value` standardized by DROP's rule for `field` (one of FIELDS); null when empty or invalid.
    `data_type` is the column's type: a date of birth held as a date or timestamp is formatted,
    one held as a string is parsed first (ISO, yyyymmdd, m/d/yyyy, "July 4, 1776", "Jul 4, 1776").
    `ascii_names`: the rows are known to hold ASCII names (`names_ascii`), standardized by Spark's own
    functions then (normalization, transliteration and folding change no ASCII character)."""
    text = value.cast("string")
    if field == "email":  # every whitespace character, inside too; nothing else changes
        return _nonempty(F.lower(F.regexp_replace(text, r"(?U)\s", "")))
    if field == "phone":  # the last ten digits, or all of fewer
        digits = F.regexp_replace(text, "[^0-9]", "")
        return _nonempty(F.substring(digits, -10, 10))
    if field in ("maid", "vin", "ctvid"):
        kept = F.regexp_replace(F.lower(text), "[^0-9a-f]" if field == "maid" else "[^0-9a-z]", "")
        lengths = {"maid": (32, 32), "vin": (17, 17), "ctvid": (8, 32)}[field]
        return F.when(F.length(kept).between(*lengths), kept)
    if field == "zip":  # the +4 goes before leading zeros do: 00300-9999 -> 300
        kept = F.regexp_replace(text, "[^0-9A-Za-z]", "")
        plus4 = kept.rlike(r"^[0-9]{9}$") if (rules or Rules()).zip_plus4 == "nine_digits" \
            else text.rlike(r"^\s*[0-9]{5}-[0-9]{4}\s*$")
        base = F.when(plus4, F.substring(kept, 1, 5)).otherwise(kept)
        return _nonempty(F.substring(F.regexp_replace(F.lower(base), "^0+", ""), 1, 5))
    if field == "dob":
        if isinstance(data_type, (DateType, TimestampType, TimestampNTZType)):
            return F.date_format(value, "yyyyMMdd")
        trimmed = F.trim(text)
        parsed = F.lit(None).cast("date")
        for shape, pattern in reversed(_DOB_SHAPES):  # try_: a day that does not exist is null, never an error
            parsed = F.when(trimmed.rlike(shape), F.to_date(F.try_to_timestamp(trimmed, F.lit(pattern)))
                            ).otherwise(parsed)
        return F.date_format(parsed, "yyyyMMdd")
    if field in NAME_FIELDS:
        return _nonempty(F.lower(F.regexp_replace(text, "[^0-9A-Za-z]", ""))) if ascii_names else _NAME(text)
    raise ValueError(f"no DROP standardization for {field!r}; one of {', '.join(FIELDS)}")


def digest(text: Column) -> Column:
    """base64(sha256(utf8(text))): 44 characters, standard alphabet with padding; null stays null."""
    return F.base64(F.unhex(F.sha2(text, 256)))


def hashed(field: str, value: Column, data_type: DataType = _TEXT, rules: Rules | None = None,
           ascii_names: bool = False) -> Column:
    """The DROP hash of one field's value (`standardized`, then `digest`); null when invalid."""
    return digest(standardized(field, value, data_type, rules, ascii_names))


def list_hash(list_name: str, values: Mapping[str, Column], types: Mapping[str, DataType] | None = None,
              rules: Rules | None = None, ascii_names: bool = False) -> Column:
    """The hash DROP sends for a list (a key of LISTS) from the record's field values (`values`, one
    Column per field of the list). A composite list hashes each field, joins the 44-character hashes
    in the list's order and hashes that; null when any field is invalid (a match is all or nothing).
    `ascii_names`: see `standardized`."""
    fields = LISTS.get(list_name)
    if fields is None:
        raise ValueError(f"no DROP list {list_name!r}; one of {', '.join(LISTS)}")
    missing = [f for f in fields if f not in values]
    if missing:
        raise ValueError(f"the DROP list {list_name} needs {', '.join(missing)}")
    parts = [hashed(f, values[f], (types or {}).get(f, _TEXT), rules, ascii_names) for f in fields]
    return parts[0] if len(parts) == 1 else digest(F.concat(*parts))

