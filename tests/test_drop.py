"""California DROP: standardization and hashing (every published vector), reading downloads."""

import base64
import hashlib
import json
import re
import unicodedata

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructField, StructType

from lakehouse_dsr.drop.hashing import Rules, hashed, list_hash, standardized, standardized_name

# CalPrivacy's worked examples and the v1.2.0 golden vectors (../shared/DROP.md section 3):
# (field, input, standardized, hash).
VECTORS = [
    ("first_name", "Juan Pablo", "juanpablo", "91hIbrbzNeqHs3o81O5yNrXUj7wDd2shvZ6THKi9qz8="),
    ("last_name", "Martinez", "martinez", "2wRPGbwBNxhShjRczx8GfS2c4cjvs4NJskeWloUNtp8="),
    ("dob", "July 4, 1776", "17760704", "skXYXxBER6HQTZ3rXSZH1wVGLQ054mS5rbR/bwvzy4I="),
    ("dob", "1985-07-04", "19850704", "IWi7qxOAbBJe0fNciDj76Eg84gmj40rB7aNMK/VnFOI="),
    ("zip", "91790-3771", "91790", "2FPZucR4x7U8KlM+SFAX4LPGhwNz/PIZUCSUdDh0o/s="),
    ("zip", "M1B 1A1", "m1b1a", "n8L9q8mVeT6Xt9/EeUNiTukGDrkbPJ3DvOEx14uElxk="),
    ("zip", "00712345", "71234", "aeNUYKh7Xw5sqpxSbSP9eOHsj6iXewbUyavv89DIuhQ="),
    ("zip", " 00712345", "71234", "aeNUYKh7Xw5sqpxSbSP9eOHsj6iXewbUyavv89DIuhQ="),
    ("zip", "00300-9999", "300", "mDvWFLta/s5as7YCP3EUfNe2vCMU+dJ690IlQcZVg4k="),
    ("zip", " 00300-9999", "300", "mDvWFLta/s5as7YCP3EUfNe2vCMU+dJ690IlQcZVg4k="),
    ("email", "Anna.Smith@Domain.com", "anna.smith@domain.com", "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="),
    ("email", "danielle.johnson12@example.com", "danielle.johnson12@example.com",
     "mKDnDvwF2inxrKcK1hJN2TRkxPfL6kzNNTtU12eH8Bw="),
    ("phone", "+1(415)555-9317", "4155559317", "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E="),
    ("phone", "+84(90)123 4567", "4901234567", "ptzVkgbv9DonwvPCHmXmJ2SEOaolSh37z3ZzY/Gmm+U="),
    ("phone", "+354(123)4567", "3541234567", "Btrzydf5K6ALAKKXJGFHSx7u5bDzHC9WlVYtpq1n2rY="),
    ("phone", "5551273811", "5551273811", "jr/RAWYVN+ODBf2vRxwBASPwiO4x27OGI1y3IDhcwLo="),
    ("vin", "1HGCM82633A004352", "1hgcm82633a004352", "iNswy1m+0VSt8jAfFrvaiQ1R/0HAbgSwNGkwqo6QBss="),
    ("maid", "a3f1c2d4-5678-90ab-cdef-1234567890ab", "a3f1c2d4567890abcdef1234567890ab",
     "250KY6lOgzYUB3EHrkbDCE2kMEZQE69SF38muhoDudI="),
    ("ctvid", "SmartTV_9F8E7D6C", "smarttv9f8e7d6c", "d9fxuTIrKksBXYDlaWsvQbcyUUfCbUx7v78gd+KP+tc="),
    # Names by one third-party reading of the rules (secondary: not CalPrivacy's own).
    ("first_name", "José", "jose", "HsTtA3dmqhgdiECtBLn8bhlf033twEyYpXZ6Z9N1js4="),
    ("last_name", "Müller", "muller", "qLH8g8uSrZC3MZN892EW72waukNvjQ0OxnPo00AirKg="),
    ("last_name", "O'Brien", "obrien", "tMtssz/kuGWGjeglAjoeJ5DcEqwB7MjXxa/oJUBxyLo="),
    ("first_name", "Mary-Jane", "maryjane", "8I9Eil56ncNhm7fBKfan1fxq8ALOoXrXHf3Bxo9NTg4="),
    ("last_name", "Straße", "strasse", "FtlpUgh3dP7gabdYXTmRsk2QwYHAmyEptJCMNbqn8MA="),
    ("first_name", "محمد", "محمد", "DLTJshBi3k0sDt1I78n6hrl/3IpqTn+nCSVE+E4SH2E="),
    ("first_name", "שלום", "שלום", "t6wDmO90GTq3OLId8JEjKTA98Q2GjCusN6hKWdEsDi8="),
    ("last_name", "Иванов", "ivanov", "XADYpQziZ5wwj1rxgLAUMCgs1snfav0OfMyQorOVVIg="),
    ("last_name", "Ёлкина", "yolkina", "76+cWLeQDX12pDMJWw+j6jNgjkh09RHp/1ovYf8WuMU="),
    ("last_name", "Щербакова", "shcherbakova", "lsADHYr3cQfIKD6Eq/o+SfsxvBHaIT7MuwP/n9sDVHQ="),
    ("last_name", "田中", "田中", "GAZJa8t1PCgPk0u94hpBrVeTAYcmaBwDjanPyKjIKiA="),
    ("last_name", "Θεοδώρου", "theodoroy", "oTqNXryIuGLEAMz7fjHhP/mOztw60RTlUBKXMZ4/vSA="),
    ("first_name", "Иван", "ivan", "zQuUUvw3b8TDWmAIezZvcNiD/JAVJNrx8SL70xk4T2o="),
]


def _rows(frame):
    return [tuple(r) for r in frame.collect()]


def test_every_published_vector_is_standardized_and_hashed_as_drop_does_in_spark(spark):
    """Each field of each vector through the Spark expressions the matching uses; the hashes are also
    recomputed here with hashlib from the standardized text (an independent digest)."""
    frame = spark.createDataFrame([(f, i) for f, i, _, _ in VECTORS], "field string, value string")
    by_field = {f: (standardized(f, F.col("value")), hashed(f, F.col("value"))) for f, *_ in VECTORS}
    std, digest = F.lit(None).cast("string"), F.lit(None).cast("string")
    for field, (s, h) in by_field.items():
        std = F.when(F.col("field") == field, s).otherwise(std)
        digest = F.when(F.col("field") == field, h).otherwise(digest)
    got = _rows(frame.select("field", "value", std.alias("s"), digest.alias("h")))
    assert sorted(got) == sorted((f, i, s, h) for f, i, s, h in VECTORS)
    for _, _, s, h in VECTORS:
        assert base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() == h


@pytest.mark.parametrize("list_name, fields, final", [
    ("ndz", {"first_name": "Danielle", "last_name": "Johnson", "dob": "July 4, 1985", "zip": "91790"},
     "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA="),
    ("namevin", {"first_name": "Eve", "last_name": "Genesis", "vin": "1HGCM82633A004352"},
     "rtnDuXIe63jXYQQXW5r07GJ7lSsrib8+46QuKFwkOmk="),
    ("email", {"email": " Anna.Smith@Domain.com "}, "KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE="),
])
def test_a_list_s_hash_is_its_fields_hashes_joined_in_order_and_hashed_again(spark, list_name, fields, final):
    frame = spark.createDataFrame([tuple(fields.values())], ", ".join(f"{f} string" for f in fields))
    assert _rows(frame.select(list_hash(list_name, {f: F.col(f) for f in fields}))) == [(final,)]


def test_names_hash_alike_whether_spark_s_functions_or_the_python_rule_standardize_them(spark):
    """The matching hashes rows whose names are ASCII with Spark's own functions and sends only the
    others to the Python rule (Placement.hashed): every row's hash is the one the Python rule gives."""
    from lakehouse_dsr.drop.matching import NO_HASH, Placement

    names = [("Juan Pablo", "O'Neil-Smith"), ("José", "Müller"), ("Θεοδώρου", "Ann"), ("ANN", "  "), (None, "Lee"),
             ("Zoë", "Йорк"), ("x1 2", "Y_z"), ("", "Poe"), ("ﬁona", "Ｌee")]
    frame = spark.createDataFrame([(str(i), f, n, "19850704", "91790") for i, (f, n) in enumerate(names)],
                                  "id string, f string, l string, dob string, zip string")
    place = Placement("ndz", "t.people", "id", {"first_name": "f", "last_name": "l", "dob": "dob", "zip": "zip"})
    split = dict(_rows(place.hashed(frame, None, F.col("id"))))
    everywhere = dict(_rows(frame.select("id", place.hash(frame.schema))))
    assert {i: h for i, h in everywhere.items() if h is None} == {i: None for i, h in split.items() if h == NO_HASH + i}
    assert {i: h for i, h in split.items() if h != NO_HASH + i} == {i: h for i, h in everywhere.items() if h}
    assert [everywhere[str(i)] is None for i in range(len(names))] == [False] * 3 + [True, True, False, False, True,
                                                                                     False]


def test_a_date_of_birth_held_as_a_date_hashes_as_the_same_day_written_out(spark):
    frame = spark.createDataFrame([("1985-07-04",)], "d string").select(F.to_date("d").alias("d"))
    assert _rows(frame.select(hashed("dob", F.col("d"), DateType()))) == \
        [("IWi7qxOAbBJe0fNciDj76Eg84gmj40rB7aNMK/VnFOI=",)]


@pytest.mark.parametrize("field, value", [
    ("maid", "a3f1c2d4-5678-90ab-cdef-1234567890"),  # 30 hex digits
    ("vin", "1HGCM82633A00435"), ("ctvid", "tv_12"), ("ctvid", "x" * 33),
    ("email", " \t "), ("phone", "n/a"), ("zip", "-000-"), ("first_name", "--"), ("dob", "1985-13-45"),
    ("dob", "yesterday"), ("email", None),
])
def test_a_value_empty_or_invalid_after_standardization_gets_no_hash(spark, field, value):
    """Never the hash of an empty string: a record with such a value cannot match anyone."""
    frame = spark.createDataFrame([(value,)], StructType([StructField("v", StringType())]))
    assert _rows(frame.select(hashed(field, F.col("v")))) == [(None,)]


def test_a_composite_with_one_invalid_field_has_no_hash(spark):
    frame = spark.createDataFrame([("Eve", "Genesis", "1HGCM8263")], "f string, l string, v string")
    assert _rows(frame.select(list_hash("namevin", {"first_name": F.col("f"), "last_name": F.col("l"),
                                                    "vin": F.col("v")}))) == [(None,)]


def test_how_a_zip_plus_4_is_recognised_is_a_rule_and_differs_only_for_nine_bare_digits(spark):
    frame = spark.createDataFrame([("003001234",), ("00300-1234",)], "z string")
    nine = _rows(frame.select(standardized("zip", F.col("z"))))
    hyphen = _rows(frame.select(standardized("zip", F.col("z"), rules=Rules(zip_plus4="hyphenated"))))
    assert nine == [("300",), ("300",)] and hyphen == [("30012",), ("300",)]


def test_names_keep_other_scripts_and_lose_what_is_not_a_letter_or_digit_whatever_their_normal_form():
    composed, decomposed = "Zoë Йорк", unicodedata.normalize("NFD", "Zoë Йорк")
    assert standardized_name(composed) == standardized_name(decomposed) == "zoeyork"
    assert standardized_name("김 민준") == "김민준" and standardized_name("'-. ") is None


def test_an_unknown_field_or_list_or_a_missing_field_is_refused_by_name(spark):
    with pytest.raises(ValueError, match="no DROP standardization for 'ssn'"):
        standardized("ssn", F.col("x"))
    with pytest.raises(ValueError, match="no DROP list 'passport'"):
        list_hash("passport", {})
    with pytest.raises(ValueError, match="needs dob, zip"):
        list_hash("ndz", {"first_name": F.col("f"), "last_name": F.col("l")})


# -- reading a download ----------------------------------------------------------------------------
HASHES = ["KA18MT/ph6IHYjzT9zwETySDQyvSh87YuoSBpOQtkhE=", "vGM7y5n+hBXRSEAklhHDPCbysyNgYTmXdMcagGUOY8E=",
          "PQOfn1RffEKmqMmNAzDKKaoZCwxWbQZkQzPWmQo9REA=", "250KY6lOgzYUB3EHrkbDCE2kMEZQE69SF38muhoDudI="]


def _zip(tmp_path, files: dict[str, str | bytes], name: str = "20260312_4821_DROP.zip"):
    import zipfile
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, content in files.items():
            archive.writestr(member, content)
    return path


def test_a_download_s_lists_and_withdrawals_are_read_with_their_work_items(tmp_path):
    from lakehouse_dsr.drop.download import read_download
    path = _zip(tmp_path, {
        "20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nB7kP2xQ9Lm4R,{HASHES[1]}\n",
        "20260312_4821_NDZ.csv": f"\ufeffID,Hash\r\nC7kP2xQ9Lm4R,{HASHES[2]}\r\n",  # a BOM, CRLF
        "20260312_4821_MAID.csv": "ID,Hash\n",  # nothing new on this list
        "20260312_4821_Removed.csv": f"ID,Hash,ListType\nZ7kP2xQ9Lm4R,{HASHES[3]},NameVIN\n"})
    download = read_download(path)
    assert (download.name, download.day.isoformat(), download.broker_id) == (path.name, "2026-03-12", "4821")
    assert download.counts() == {"email": 2, "ndz": 1, "maid": 0}
    assert sorted(download.items.to_pylist(), key=lambda r: r["work_item_id"]) == [
        {"work_item_id": "A7kP2xQ9Lm4R", "list_type": "email", "hash": HASHES[0]},
        {"work_item_id": "B7kP2xQ9Lm4R", "list_type": "email", "hash": HASHES[1]},
        {"work_item_id": "C7kP2xQ9Lm4R", "list_type": "ndz", "hash": HASHES[2]}]
    assert download.removed.to_pylist() == [{"work_item_id": "Z7kP2xQ9Lm4R", "list_type": "namevin",
                                             "hash": HASHES[3]}]
    assert download.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("files, message", [
    ({"20260312_4821_Email.csv": f"Id,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\n"},
     r"20260312_4821_Email.csv, line 1: the header must be exactly 'ID,Hash', found 'Id,Hash'"),
    ({"20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nA7kP2xQ9Lm4,{HASHES[1]}\n"},
     r"20260312_4821_Email.csv, line 3: the ID is not 12 letters or digits"),
    ({"20260312_4821_Phone.csv": "ID,Hash\nA7kP2xQ9Lm4R,not-a-hash\n"},
     r"20260312_4821_Phone.csv, line 2: the Hash is not a SHA-256 in Base64"),
    ({"20260312_4821_Phone.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]},Email\n"},
     r"20260312_4821_Phone.csv, line 2: 3 fields, not 2"),
    ({"20260312_4821_Removed.csv": f"ID,Hash,ListType\nA7kP2xQ9Lm4R,{HASHES[0]},SSN\n"},
     r"20260312_4821_Removed.csv, line 2: the ListType is not one of"),
    ({"20260312_4821_Email.csv": "ID,Hash\n", "notes.txt": "hello"}, r"notes.txt: not a DROP file"),
    ({"20260312_4821_Email.csv": "ID,Hash\n", "20260313_4821_Phone.csv": "ID,Hash\n"},
     r"of different days or brokers \(20260312_4821, 20260313_4821\)"),
    ({"20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\n",
      "20260312_4821_Phone.csv": f"ID,Hash\nB7kP2xQ9Lm4R,{HASHES[1]}\nA7kP2xQ9Lm4R,{HASHES[2]}\n"},
     r"work-item ID at line 2 of the Email list appears 2 times"),
    ({"20260312_4821_Email.csv": b"ID,Hash\n\xff\n"}, r"20260312_4821_Email.csv, line 2: not UTF-8"),
    ({"20261399_4821_Email.csv": "ID,Hash\n"}, r"20261399 in its file names is not a date"),
    ({}, r"the archive holds no file"),
])
def test_a_download_that_breaks_the_format_is_refused_with_the_file_line_and_reason(tmp_path, files, message):
    from lakehouse_dsr.drop.download import DropFileError, read_download
    with pytest.raises(DropFileError, match=message) as refused:
        read_download(_zip(tmp_path, files))
    assert not any(h in str(refused.value) for h in HASHES)  # a hash is personal data: never quoted


def test_a_file_that_is_no_zip_is_refused(tmp_path):
    from lakehouse_dsr.drop.download import DropFileError, read_download
    (tmp_path / "x.zip").write_text("ID,Hash\n")
    with pytest.raises(DropFileError, match="not a ZIP archive"):
        read_download(tmp_path / "x.zip")
    with pytest.raises(DropFileError, match="no such file"):
        read_download(tmp_path / "missing.zip")


# -- filing downloads in the ledger ------------------------------------------------------------------
def _items(ledger) -> dict[str, dict]:
    """The ledger's work items as pyiceberg reads the table itself (not through the engine's store)."""
    rows = ledger.store.catalog.load_table(ledger.store.name("drop_items")).scan().to_arrow().to_pylist()
    return {r["work_item_id"]: r for r in rows}


def test_a_download_is_filed_once_its_withdrawals_withdraw_only_what_is_unsettled_and_the_cycle_is_shown(tmp_path):
    from datetime import UTC, date, datetime

    from helpers import make_settings
    from lakehouse_dsr.drop.items import drop_status, import_download
    from lakehouse_dsr.ledger.ledger import Ledger

    ledger = Ledger(make_settings(tmp_path))
    first = _zip(tmp_path, {"20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nB7kP2xQ9Lm4R,{HASHES[1]}\n",
                            "20260312_4821_NDZ.csv": f"ID,Hash\nC7kP2xQ9Lm4R,{HASHES[2]}\n",
                            "20260312_4821_MAID.csv": "ID,Hash\n"})
    march = datetime(2026, 3, 13, 9, 0, tzinfo=UTC)
    result = import_download(ledger, first, now=march)
    assert (result.filed, result.already_filed, result.withdrawn, result.repeated) == (3, 0, 0, False)
    assert result.lists == {"email": 2, "ndz": 1, "maid": 0} and result.due_date == date(2026, 4, 26)
    items = _items(ledger)
    assert set(items) == {"A7kP2xQ9Lm4R", "B7kP2xQ9Lm4R", "C7kP2xQ9Lm4R"}
    assert items["C7kP2xQ9Lm4R"]["list_type"] == "ndz" and items["C7kP2xQ9Lm4R"]["hash"] == HASHES[2]
    assert all(r["status"] is None and r["download"] == first.name for r in items.values())

    again = import_download(ledger, first, now=march)  # the same download twice: nothing filed twice
    assert (again.filed, again.already_filed, again.repeated) == (0, 3, True) and len(_items(ledger)) == 3

    # B is settled (deleted) before the next download withdraws it and A; it stays as it was.
    ledger.store.replace("drop_items", "work_item_id", ["B7kP2xQ9Lm4R"],
                         lambda rows: [{**r, "status": 3, "status_at": march} for r in rows])
    second = _zip(tmp_path, {"20260420_4821_Email.csv":
                             f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nD7kP2xQ9Lm4R,{HASHES[3]}\n",
                             "20260420_4821_Removed.csv": f"ID,Hash,ListType\nA7kP2xQ9Lm4R,{HASHES[0]},Email\n"
                                                          f"B7kP2xQ9Lm4R,{HASHES[1]},Email\n"},
                  name="20260420_4821_DROP.zip")
    april = datetime(2026, 4, 20, 8, 0, tzinfo=UTC)
    result = import_download(ledger, second, now=april)
    assert (result.filed, result.already_filed, result.withdrawn) == (1, 1, 1)
    items = _items(ledger)
    assert items["A7kP2xQ9Lm4R"]["withdrawn_at"] == april and items["B7kP2xQ9Lm4R"]["withdrawn_at"] is None
    assert items["A7kP2xQ9Lm4R"]["download"] == first.name  # filed by the download that brought it first
    assert items["D7kP2xQ9Lm4R"]["due_date"] == date(2026, 6, 4)

    status = drop_status(ledger, today=date(2026, 5, 1))
    assert (status.last_download, status.last_download_day, status.last_access) == \
        (second.name, date(2026, 4, 20), april)
    assert status.items == {"pending": 2, "withdrawn": 1, "exempted": 0, "deleted": 1, "opted_out": 0, "not_found": 0}
    assert status.unreported == 1  # B's status was never uploaded
    assert (status.next_access_by, status.days_left_in_cycle, status.next_deadline) == \
        (date(2026, 6, 4), 34, date(2026, 4, 26))


def test_dsr_drop_import_refuses_a_malformed_download_with_exit_2_and_files_nothing(tmp_path):
    """The commands as a user runs them, each in its own process, which never imports PySpark (the
    control plane starts no JVM)."""
    import subprocess
    import sys

    from helpers import make_settings, write_config

    config = write_config(make_settings(tmp_path), tmp_path / "dsr.yaml")

    def dsr(*args: str) -> subprocess.CompletedProcess:
        wrapper = ("import atexit, sys\n"
                   "atexit.register(lambda: print('pyspark imported' if 'pyspark' in sys.modules else '',\n"
                   "                              file=sys.stderr))\n"
                   "from lakehouse_dsr.cli import entry\nentry()")
        done = subprocess.run([sys.executable, "-c", wrapper, "-c", str(config), "drop", *args],
                              capture_output=True, text=True, timeout=300)
        assert "pyspark imported" not in done.stderr
        return done

    bad = _zip(tmp_path, {"20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nA7kP2xQ9Lm4R\n"})
    result = dsr("import", str(bad))
    assert result.returncode == 2 and "20260312_4821_Email.csv, line 3: 1 fields, not 2" in result.stderr
    assert "Traceback" not in result.stderr
    status = dsr("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["items"]["pending"] == 0
    good = _zip(tmp_path, {"20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\n"}, name="good.zip")
    result = dsr("import", str(good))
    assert result.returncode == 0 and "1 work item(s) filed" in result.stdout and "due 2026-04-26" in result.stdout
    status = dsr("status")
    assert status.returncode == 0 and "pending 1" in status.stdout and HASHES[0] not in status.stdout


# -- matching the lake ---------------------------------------------------------------------------------
def _b64(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _download(tmp_path, day: str, rows: dict[str, list[tuple[str, str]]]):
    """A download of `rows` ({DROP list name: [(work item ID, hash)]})."""
    return _zip(tmp_path, {f"{day}_4821_{kind}.csv": "ID,Hash\n" + "".join(f"{i},{h}\n" for i, h in items)
                           for kind, items in rows.items()}, name=f"{day}_4821_DROP.zip")


@pytest.mark.parametrize("users_format", ["iceberg", "delta"])
def test_work_items_are_matched_in_spark_to_one_person_several_or_nobody_and_filed_once(
        spark, new_lakehouse, tmp_path, users_format):
    """Emails from the users table (Iceberg or Delta), phones and the NDZ composite from a profiles
    table: one person per item asks for an erasure (a person matched by two items gets one request),
    a phone two people share opts both out, an unknown email is status 5 until the lake gains its
    owner. The hashes here are recomputed with hashlib from the plaintext, independently of Spark's."""
    from datetime import UTC, date, datetime

    from helpers import add_subjects, datamap_dict
    from lakehouse_dsr.datamap import DataMap
    from lakehouse_dsr.drop.items import import_download
    from lakehouse_dsr.drop.matching import match_items
    from lakehouse_dsr.lake.lakehouse import Lake
    from lakehouse_dsr.ledger.ledger import Ledger

    settings = new_lakehouse(users=5, events=20, delta=["demo.users"] if users_format == "delta" else None)
    add_subjects(spark, settings, ["ann", "bob", "cat", "dan"], "p")  # emails p0@example.net ... p3@example.net
    spark.createDataFrame(
        [("ann", "Ann", "Lee", date(1990, 1, 2), "10001", "+1 (212) 555-0101"),
         ("bob", "Bob", "Roe", date(1980, 5, 6), "94105-1234", "415-555-0000"),
         ("cat", "Cat", "Poe", date(1970, 7, 8), "60601", "+1 415 555 0000"),
         ("dan", "Dan", "Müller", date(1985, 7, 4), "91790-3771", None)],
        "user_id string, first_name string, last_name string, birth_date date, zip string, phone string",
    ).writeTo(settings.table("demo.profiles")).create()
    raw = datamap_dict(settings.datamap)
    raw["identifiers"]["phone"] = {"table": "demo.profiles", "subject_column": "user_id", "column": "phone"}
    raw["tables"]["demo.profiles"] = {"key": "user_id"}
    raw["drop"] = {"email": {"identifier": "email"}, "phone": {"identifier": "phone"},
                   "ndz": {"table": "demo.profiles", "subject_column": "user_id", "first_name": "first_name",
                           "last_name": "last_name", "dob": "birth_date", "zip": "zip"}}
    settings = settings.replace(datamap=DataMap.model_validate(raw))
    ledger = Ledger(settings)
    ndz = lambda *fields: _b64("".join(_b64(f) for f in fields))  # noqa: E731
    import_download(ledger, _download(tmp_path, "20260312", {
        "Email": [("EMAILann0001", _b64("p0@example.net")), ("EMAILnone001", _b64("p9@example.net"))],
        "Phone": [("PHONEshared1", _b64("4155550000"))],
        "NDZ": [("NDZdan000001", ndz("dan", "muller", "19850704", "91790")),
                ("NDZann000001", ndz("ann", "lee", "19900102", "10001"))]}))
    lake = Lake.of(spark, settings)

    result = match_items(lake, ledger, settings)
    assert (result.items, result.one_person, result.several_people, result.not_found) == (5, 3, 1, 1)
    assert (result.erase_requests, result.opt_out_requests) == (2, 2)  # ann once for two items
    requests = {r["request_id"]: r for r in ledger.requests()}
    assert sorted((r["subject_id"], r["request_type"], r["regulation"], r["due_date"]) for r in requests.values()) == [
        ("ann", "erase", "ccpa", date(2026, 4, 26)), ("bob", "opt_out", "ccpa", date(2026, 4, 2)),
        ("cat", "opt_out", "ccpa", date(2026, 4, 2)), ("dan", "erase", "ccpa", date(2026, 4, 26))]
    items = _items(ledger)
    linked = {i: json.loads(r["request_ids"]) if r["request_ids"] else None for i, r in items.items()}
    assert linked["EMAILann0001"] == linked["NDZann000001"] and len(linked["EMAILann0001"]) == 1
    # the request carries the work items it answers (its certificate names them)
    assert json.loads(requests[linked["EMAILann0001"][0]]["drop_work_items"]) == ["EMAILann0001", "NDZann000001"]
    assert {json.dumps(json.loads(requests[r]["drop_work_items"])) for r in linked["PHONEshared1"]} == \
        {'["PHONEshared1"]'}
    assert {requests[r]["subject_id"] for r in linked["PHONEshared1"]} == {"bob", "cat"}
    assert items["PHONEshared1"]["subjects"] == 2 and items["EMAILnone001"]["subjects"] == 0
    assert (items["EMAILnone001"]["status"], linked["EMAILnone001"]) == (5, None)
    assert all(items[i]["status"] is None for i in ("EMAILann0001", "PHONEshared1", "NDZdan000001"))

    again = match_items(lake, ledger, settings)  # only the unknown email is looked for again: still nobody
    assert (again.items, again.not_found, again.erase_requests) == (1, 1, 0) and len(ledger.requests()) == 4

    add_subjects(spark, settings, ["eve"], "p9-")  # eve's email is p9-0@example.net: still not p9@example.net
    spark.sql(f"UPDATE {lake.quoted('demo.users')} SET email = 'P9@Example.net ' WHERE user_id = 'eve'")
    later = match_items(lake, ledger, settings)
    assert (later.items, later.one_person, later.not_found, later.erase_requests) == (1, 1, 0, 1)
    items = _items(ledger)
    assert items["EMAILnone001"]["status"] is None and items["EMAILnone001"]["subjects"] == 1
    eve = [r for r in ledger.requests() if r["subject_id"] == "eve"]
    assert [(r["request_type"], r["received_at"]) for r in eve] == [("erase", datetime(2026, 3, 12, tzinfo=UTC))]


def test_a_drop_cycle_answers_every_work_item_with_what_the_run_did_and_amends_what_changed(
        spark, new_lakehouse, tmp_path):
    """A download built from the lake's own identifiers: an email of one person, one two people share,
    one of a held person, one withdrawn by the next download's Removed file before any run, one nobody
    has; NDZ and NameVIN from a profiles table the data map exempts from erasure (so a person found
    only there is status 2, and people erased elsewhere 3 with their profile kept). `run` matches and
    acts; the export answers every item (withdrawn ones need none) in DROP's Id,Status files,
    owner-only. Then the unknown email's owner arrives through `ingest`: the next run erases them and
    the next export amends 5 to 3; a hold's end amends 2 to 3. People are checked gone, or kept, with pyiceberg."""
    import os
    import stat
    from datetime import date

    from helpers import add_subjects, datamap_dict, live_rows
    from lakehouse_dsr.datamap import DataMap
    from lakehouse_dsr.drop.items import drop_status, export_answers, import_download
    from lakehouse_dsr.drop.matching import match_items
    from lakehouse_dsr.evidence.certificate import build_certificate, certificate_html, check_certificate
    from lakehouse_dsr.ingest.stream import ingest
    from lakehouse_dsr.lake.lakehouse import Lake
    from lakehouse_dsr.ledger.holds import add_hold, list_holds, release_hold
    from lakehouse_dsr.ledger.ledger import Ledger
    from lakehouse_dsr.runner import run

    settings = new_lakehouse(users=5, events=20)
    people = ["ann", "bob", "cat", "dan", "hal", "eve", "fay"]
    add_subjects(spark, settings, people, "q")  # q0@example.net ... q6@example.net
    spark.sql(f"UPDATE {settings.table('demo.users')} SET email = 'shared@example.net' WHERE user_id IN ('bob', 'cat')")
    spark.createDataFrame(
        [("eve", "Eve", "O'Neil", date(1985, 7, 4), "00300-9999", None),
         ("fay", "Fay", "Genesis", date(1990, 1, 1), "10001", "1HGCM82633A004352"),
         ("ida", "Ida", "Noor", date(1975, 3, 9), "10001", "2HGCM82633A004352")],  # in no other table
        "user_id string, first_name string, last_name string, birth_date date, zip string, vin string",
    ).writeTo(settings.table("demo.profiles")).create()
    raw = datamap_dict(settings.datamap)
    raw["tables"]["demo.profiles"] = {"key": "user_id", "exempt": "CCPA 1798.105(d)(8): kept for a legal obligation"}
    profile = {"table": "demo.profiles", "subject_column": "user_id", "first_name": "first_name",
               "last_name": "last_name"}
    raw["drop"] = {"email": {"identifier": "email"}, "ndz": {**profile, "dob": "birth_date", "zip": "zip"},
                   "namevin": {**profile, "vin": "vin"}}
    settings = settings.replace(datamap=DataMap.model_validate(raw))
    ledger, out = Ledger(settings), tmp_path / "answers"
    composite = lambda *fields: _b64("".join(_b64(f) for f in fields))  # noqa: E731
    import_download(ledger, _download(tmp_path, "20260312", {
        "Email": [("EMAILann0001", _b64("q0@example.net")), ("EMAILshared1", _b64("shared@example.net")),
                  ("EMAILdan0001", _b64("q3@example.net")), ("EMAILhal0001", _b64("q4@example.net")),
                  ("EMAILlater01", _b64("later@example.net"))],
        "NDZ": [("NDZeve000001", composite("eve", "oneil", "19850704", "300"))],
        "NameVIN": [("NVINfay00001", composite("fay", "genesis", "1hgcm82633a004352")),
                    ("NVINida00001", composite("ida", "noor", "2hgcm82633a004352"))],
        "Phone": []}))
    match_items(Lake.of(spark, settings), ledger, settings)  # `dsr drop match`: hal's request is filed ...
    assert len(ledger.requests()) == 8
    withdrawal = f"ID,Hash,ListType\nEMAILhal0001,{_b64('q4@example.net')},Email\n"
    removed = _zip(tmp_path, {"20260313_4821_Email.csv": "ID,Hash\n", "20260313_4821_Removed.csv": withdrawal},
                   name="20260313_4821_DROP.zip")
    assert import_download(ledger, removed).withdrawn == 1  # ... and withdrawn before any run acted on it
    assert "hal" not in {r["subject_id"] for r in ledger.requests()}
    add_hold(ledger, "litigation", "test", subject="dan")

    report = run(spark, settings)
    assert len(report.completed) == 6 and len(report.legally_held) == 1  # ann eve fay ida erased, bob cat opted out
    users = {str(u) for u in live_rows(settings, "demo.users").column("user_id").to_pylist()}
    assert users.isdisjoint({"ann", "eve", "fay"}) and {"bob", "cat", "dan", "hal"} <= users
    profiles = sorted(str(u) for u in live_rows(settings, "demo.profiles").column("user_id").to_pylist())
    assert profiles == ["eve", "fay", "ida"]  # exempt: kept
    (eve,) = json.loads(_items(ledger)["NDZeve000001"]["request_ids"])
    kept = build_certificate(ledger, eve)["tables"]
    assert (kept["demo.profiles"]["action"], kept["demo.profiles"]["kept"]) == ("keep", True)
    assert kept["demo.profiles"]["exempt"].startswith("CCPA 1798.105(d)(8)") and kept["demo.users"]["rows"] == 1
    # nothing is purged in an exempt table, so only its live data is checked (whether it keeps the person)
    assert kept["demo.profiles"]["checks"] == ["live"] and "storage" in kept["demo.users"]["checks"]
    (ann,) = json.loads(_items(ledger)["EMAILann0001"]["request_ids"])
    certificate = build_certificate(ledger, ann)  # names the work item it answers, signed
    assert certificate["request"]["drop_work_items"] == ["EMAILann0001"]
    assert check_certificate(certificate, ledger).intact and "EMAILann0001" in certificate_html(certificate)
    first = export_answers(ledger, out)
    assert first.pending == 0 and first.amendments == {}
    assert first.uploads == {"20260312_4821_Email.csv": 4, "20260312_4821_NDZ.csv": 1,
                             "20260312_4821_NameVIN.csv": 2}
    assert (out / "20260312_4821_Email.csv").read_text() == \
        "Id,Status\nEMAILann0001,3\nEMAILdan0001,2\nEMAILlater01,5\nEMAILshared1,4\n"
    assert (out / "20260312_4821_NDZ.csv").read_text() == "Id,Status\nNDZeve000001,3\n"
    assert (out / "20260312_4821_NameVIN.csv").read_text() == "Id,Status\nNVINfay00001,3\nNVINida00001,2\n"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in out.iterdir())

    landing = tmp_path / "landing"  # the unknown email's owner arrives through an ingest
    landing.mkdir()
    (landing / "a.json").write_text('{"user_id": "gus", "created_at": "2026-04-01T00:00:00", "name": "G", '
                                    '"email": " Later@Example.net"}\n')
    screened = ingest(spark, settings, str(landing), "json", "demo.users", str(tmp_path / "ckpt"), once=True)
    # caught at the door: the batch carried the waiting item's hash, and the match after it filed gus's request
    assert (screened.drop_listed, screened.drop_matched["one_person"], screened.drop_matched["erase_requests"]) \
        == (1, 1, 1)
    assert [r["status"] for r in ledger.requests() if r["subject_id"] == "gus"] == ["received"]
    report = run(spark, settings)
    assert report.drop == {} and len(report.completed) == 1  # nothing waited any more: the run only erased
    assert "gus" not in {str(u) for u in live_rows(settings, "demo.users").column("user_id").to_pylist()}
    second = export_answers(ledger, out)
    assert (second.uploads, second.amendments) == ({}, {"20260312_4821_Email_amend01.csv": 1})
    assert (out / "20260312_4821_Email_amend01.csv").read_text() == "Id,Status\nEMAILlater01,3\n"
    assert drop_status(ledger).unreported == 0

    (hold,) = list_holds(ledger)
    release_hold(ledger, hold.hold_id, "test")  # the hold ends: dan is erased, his 2 becomes a 3
    run(spark, settings)
    third = export_answers(ledger, out)
    assert (third.uploads, third.amendments) == ({}, {"20260312_4821_Email_amend02.csv": 1})
    assert (out / "20260312_4821_Email_amend02.csv").read_text() == "Id,Status\nEMAILdan0001,3\n"
    for path in out.iterdir():  # only work-item IDs and codes go to DROP
        assert all(re.fullmatch(r"[A-Za-z0-9]{12},[2-5]", line) for line in path.read_text().splitlines()[1:])


def test_the_demo_cycle_a_sample_download_imported_run_and_answered_with_the_cli(spark, new_lakehouse, tmp_path,
                                                                                 monkeypatch, capsys):
    """The docs' cycle over the demo lake, command by command: `dsr drop sample` writes a download of
    the demo's own emails (and some nobody has), owner-only; import, run, export answer each: 3 for
    the people (gone from demo.users, read with pyiceberg), 5 for the others; status has nothing
    left to report. A data map without drop: is refused by the sampler, with nothing written."""
    import os
    import stat
    import zipfile

    from helpers import dsr_in_process, live_rows, write_config

    settings = new_lakehouse(users=30, events=60)
    config = str(write_config(settings, tmp_path / "dsr.yaml"))
    cli = lambda *args: dsr_in_process(monkeypatch, capsys, "-c", config, *args)  # noqa: E731
    sample = tmp_path / "drop" / "sample.zip"
    code, out = cli("drop", "sample", str(sample), "--people", "4", "--unknown", "2", "--day", "2026-12-01")
    assert code == 0 and "email: 4 of the lake's people, 2 of nobody" in out, out
    assert stat.S_IMODE(os.stat(sample).st_mode) == 0o600
    with zipfile.ZipFile(sample) as archive:
        (name,) = archive.namelist()
        lines = archive.read(name).decode().splitlines()
    assert name == "20261201_0000_Email.csv" and lines[0] == "ID,Hash" and len(lines) == 7
    assert "@" not in "".join(lines)  # hashes only

    assert cli("drop", "import", str(sample))[0] == 0
    code, out = cli("run")
    assert code == 0, out
    assert cli("drop", "export", "--out", str(tmp_path / "answers"))[0] == 0
    answers = (tmp_path / "answers" / name).read_text().splitlines()
    assert answers[0] == "Id,Status" and sorted(a.split(",")[1] for a in answers[1:]) == ["3"] * 4 + ["5"] * 2
    code, out = cli("drop", "status", "--json")
    assert code == 0 and json.loads(out)["unreported"] == 0
    left = {str(u) for u in live_rows(settings, "demo.users").column("user_id").to_pylist()}
    assert len(left) == 30 - 4

    bare = write_config(settings, tmp_path / "bare.yaml", datamap={**json.loads(settings.datamap.model_dump_json(
        by_alias=True, exclude_none=True)), "drop": {}})
    code, out = dsr_in_process(monkeypatch, capsys, "-c", str(bare), "drop", "sample", str(tmp_path / "no.zip"))
    assert code == 2 and "no drop: section" in out and not (tmp_path / "no.zip").exists()


def test_two_people_given_the_same_request_id_are_refused_and_nothing_is_filed(tmp_path, monkeypatch):
    """Request ids of a match are derived (66 bits): should two people's ever collide, the match files
    nothing rather than merge two requests into one and leave a person unerased."""
    from datetime import date

    import pyarrow as pa

    from helpers import make_settings
    from lakehouse_dsr.drop import items as items_module
    from lakehouse_dsr.exceptions import LedgerError
    from lakehouse_dsr.ledger.ledger import Ledger

    ledger = Ledger(make_settings(tmp_path))
    import_ = items_module.import_download(ledger, _zip(tmp_path, {
        "20260312_4821_Email.csv": f"ID,Hash\nA7kP2xQ9Lm4R,{HASHES[0]}\nB7kP2xQ9Lm4R,{HASHES[1]}\n"}))
    assert import_.filed == 2
    looked_for = items_module.unmatched_items(ledger)
    matches = pa.table({"work_item_id": ["A7kP2xQ9Lm4R", "B7kP2xQ9Lm4R"], "subject_id": ["ann", "bob"]})
    monkeypatch.setattr(items_module, "_request_id", lambda *args: "req-19cdf57d07b85ea8fa503")
    with pytest.raises(LedgerError, match="were given the same id req-19cdf57d07b85ea8fa503; nothing was filed"):
        items_module.file_matches(ledger, looked_for, matches)
    assert ledger.requests() == [] and all(r["request_ids"] is None for r in _items(ledger).values())
    assert looked_for.column("download_day").to_pylist() == [date(2026, 3, 12)] * 2


@pytest.mark.slow  # a `dsr drop match` process of its own, with Spark's event log on
def test_no_identifier_or_drop_hash_in_the_plans_event_log_or_output_of_a_match(spark, tmp_path):
    """The lake's emails are hashed inside Spark's jobs and the work items reach Spark as Arrow batches:
    no email of the lake and no hash of the download appears in any plan Spark records, nor in what
    the command prints."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from helpers import event_log_conf, event_logs, make_disk_lakehouse
    from lakehouse_dsr.drop.items import import_download
    from lakehouse_dsr.ledger.ledger import Ledger

    settings, config = make_disk_lakehouse(spark, tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["spark"]["conf"].update(event_log_conf(tmp_path / "events"))
    raw["datamap"]["drop"] = {"email": {"identifier": "email"}}
    (tmp_path / "events").mkdir()
    config.write_text(yaml.safe_dump(raw))
    emails = sorted(str(r.email) for r in spark.table(settings.table("demo.users")).select("email").limit(3).collect())
    hashes = [_b64(e.strip().lower()) for e in emails] + [_b64("nobody@example.org")]
    import_download(Ledger(settings), _download(tmp_path, "20260312", {
        "Email": [(f"W{n:011d}", h) for n, h in enumerate(hashes)]}))
    done = subprocess.run([str(Path(sys.executable).parent / "dsr"), "-c", str(config), "drop", "match"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "4 work item(s) matched: 3 to one person" in done.stdout
    logs = event_logs(tmp_path / "events")
    assert logs and any("SparkListenerSQLExecutionStart" in log and "demo.users" in log for log in logs)
    for value in [*emails, *hashes]:
        assert value not in done.stdout + done.stderr
        assert not any(value in log for log in logs), "an identifier or a DROP hash is in the event log"
