"""Tests for dafka.config: the schema, the ZPL reader, overrides and errors."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dafka.config import KEYS, Config, ConfigError, Key, parse_override, parse_zpl

REFERENCE_CFG = """\
#   Dafka configuration
beacon
    verbose = 0
    interval = 1000
    sub_address = "tcp://127.0.0.1:5556"
    pub_address = "tcp://127.0.0.1:5557"
producer
    head_interval = 1000
consumer
    offset
        reset = earliest
store
    db = "storedb"
"""

PYTYPES = {"int": int, "bool": bool, "str": str, "choice": str}

EXPECTED_DEFAULTS = {
    "tower/verbose": False,
    "tower/sub_address": "tcp://*:5556",
    "tower/pub_address": "tcp://*:5557",
    "beacon/verbose": False,
    "beacon/interval": 1000,
    "beacon/timeout": 4000,
    "beacon/sub_address": "tcp://127.0.0.1:5556",
    "beacon/pub_address": "tcp://127.0.0.1:5557",
    "beacon/address": "",
    "producer/verbose": False,
    "producer/head_interval": 1000,
    "producer/high_watermark": 1000000,
    "producer/terminate_unacked": False,
    "consumer/verbose": False,
    "consumer/offset/reset": "latest",
    "consumer/high_watermark": 1000000,
    "store/verbose": False,
    "store/db": "storedb",
    "store/high_watermark": 1000000,
    "test/verbose": False,
    "beacon/bind_address": "",
    "beacon/scoped": 1,
    "producer/min_acks": 1,
    "producer/max_unacked": 1000000,
    "producer/max_unacked_bytes": 134217728,
    "producer/max_record_bytes": 1048576,
    "producer/send_bytes": 268435456,
    "producer/send_timeout": 60000,
    "producer/close_timeout": 30000,
    "producer/close_linger": 2000,
    "producer/fetch_inflight_bytes": 32 * 1024 * 1024,
    "producer/resume_timeout": 10000,
    "consumer/receive_bytes": 268435456,
    "consumer/fetch_max_bytes": 8 * 1024 * 1024,
    "consumer/fetch_retry": 1000,
    "consumer/heads_interval": 1000,
    "consumer/max_buffered": 100000,
    "consumer/max_buffered_bytes": 67108864,
    "consumer/batches": True,
    "consumer/bulk": True,
    "consumer/store_times": False,
    "consumer/group/auto_commit": True,
    "consumer/group/auto_commit_interval": 5000,
    "consumer/group/join_wait": 200,
    "store/sync": False,
    "store/fetch_inflight_bytes": 32 * 1024 * 1024,
    "store/batches": True,
    "store/bulk": True,
    "store/receive_bytes": 33554432,
    "store/batch_bytes": 4194304,
    "store/write_buffer_bytes": 33554432,
    "store/cache_bytes": 8388608,
    "store/block_bytes": 32768,
    "store/compression": "snappy",
    "store/max_open_files": 1000,
    "store/memory/idle_ms": 1000,
    "store/offsets/compact": True,
    "store/offsets/retention_ms": 604800000,
    "store/retention/ms": -1,
    "store/retention/bytes": -1,
}


def error_from_text(text: str, filename: str = "bad.cfg") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Config.from_text(text, filename)
    return info.value


# --------------------------------------------------------------------------
# Schema and defaults
# --------------------------------------------------------------------------


def test_every_default_present_and_typed():
    config = Config()
    for path, expected in EXPECTED_DEFAULTS.items():
        assert config[path] == expected, path
        assert type(config[path]) is PYTYPES[KEYS[path].kind], path
        assert config.source(path) == "default"
        assert KEYS[path].doc
    assert list(EXPECTED_DEFAULTS) == list(KEYS)[: len(EXPECTED_DEFAULTS)]


def test_key_is_frozen():
    with pytest.raises(AttributeError):
        KEYS["producer/head_interval"].default = 5  # type: ignore[misc]
    assert isinstance(KEYS["producer/head_interval"], Key)


def test_config_is_immutable():
    config = Config()
    with pytest.raises(TypeError):
        config["producer/head_interval"] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        config._values = {}  # type: ignore[misc]


# --------------------------------------------------------------------------
# Reading ZPL
# --------------------------------------------------------------------------


def test_reference_example_loads(tmp_path):
    path = tmp_path / "dafka.cfg"
    path.write_text(REFERENCE_CFG)
    config = Config.load(path)
    assert config["beacon/verbose"] is False
    assert config["beacon/interval"] == 1000
    assert config["beacon/sub_address"] == "tcp://127.0.0.1:5556"
    assert config["producer/head_interval"] == 1000
    assert config["consumer/offset/reset"] == "earliest"
    assert config["store/db"] == "storedb"
    assert config.source("consumer/offset/reset") == f"{path}:11"
    assert config.source("beacon/timeout") == "default"


def test_nested_sections_and_slash_names():
    text = "store\n    retention\n        ms = 5\n    bytes = 7\nstore/retention/bytes = 9\n"
    assert parse_zpl(text) == {
        "store/retention/ms": ("5", 3),
        "store/bytes": ("7", 4),
        "store/retention/bytes": ("9", 5),
    }
    config = Config.from_text(text.replace("    bytes = 7\n", ""))
    assert config["store/retention/ms"] == 5
    assert config["store/retention/bytes"] == 9


def test_dedent_returns_to_outer_level():
    text = "a\n    b\n        c = 1\n    d = 2\ne = 3\n"
    assert parse_zpl(text) == {"a/b/c": ("1", 3), "a/d": ("2", 4), "e": ("3", 5)}


def test_node_with_value_and_children():
    assert parse_zpl("a = 1\n    b = 2\n") == {"a": ("1", 1), "a/b": ("2", 2)}


def test_lone_leaf_name_has_empty_value():
    assert parse_zpl("a\n    b\n") == {"a/b": ("", 2)}


def test_quoted_values_comments_and_blank_lines():
    text = (
        "# leading comment\n"
        "\n"
        "a = \"x # y = z\"   # trailing comment\n"
        "b = 'say \"hi\"'\n"
        "c = tcp://*:5556  # unquoted, with a comment\n"
        "d = foo#bar\n"
        "e = # only a comment\n"
        "f=g=h\n"
        "      # comment lines may be indented any way\n"
        "g = two words  \r\n"
    )
    assert parse_zpl(text) == {
        "a": ("x # y = z", 3),
        "b": ('say "hi"', 4),
        "c": ("tcp://*:5556", 5),
        "d": ("foo#bar", 6),
        "e": ("", 7),
        "f": ("g=h", 8),
        "g": ("two words", 10),
    }


def test_quoted_value_with_hash_loads_into_config():
    config = Config.from_text('beacon\n    address = "host#1=2"\n')
    assert config["beacon/address"] == "host#1=2"


def test_typed_values_from_file():
    text = (
        "producer\n    verbose = yes\n    terminate_unacked = 1\n"
        "consumer\n    offset\n        reset = EARLIEST\n"
        "store\n    retention\n        ms = -1\n        bytes = +4096\n"
    )
    config = Config.from_text(text)
    assert config["producer/verbose"] is True
    assert config["producer/terminate_unacked"] is True
    assert config["consumer/offset/reset"] == "earliest"
    assert config["store/retention/bytes"] == 4096


# --------------------------------------------------------------------------
# Broken files
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("producer\n   head_interval = 5\n", 2, "multiple of 4"),
        ("producer\n        head_interval = 5\n", 2, "4 spaces deeper"),
        ("        producer\n", 1, "at most 0"),
        ("producer\n\thead_interval = 5\n", 2, "tab"),
        ("producer\n    \thead_interval = 5\n", 2, "tab"),
        ('beacon\n    address = "tcp://x\n', 2, "unterminated"),
        ("beacon\n    address = 'x\n", 2, "unterminated"),
        ('beacon\n    address = "x" y\n', 2, "after the quoted value"),
        ("producer\n    !head = 5\n", 2, "expected a name"),
        ("producer\n    head_interval 5\n", 2, "expected '='"),
        ("/producer = 5\n", 1, "invalid name"),
    ],
)
def test_syntax_errors_name_file_and_line(text, line, words):
    err = error_from_text(text)
    assert err.file == "bad.cfg"
    assert err.line == line
    assert words in err.reason
    assert str(err).startswith(f"bad.cfg:{line}: ")


def test_duplicate_key_names_both_lines():
    err = error_from_text("producer\n    head_interval = 5\n\nproducer\n    head_interval = 6\n")
    assert (err.line, err.key) == (4, "producer")
    assert "line 1" in err.reason
    err = error_from_text("producer\n    head_interval = 5\nproducer/head_interval = 6\n")
    assert (err.line, err.key) == (3, "producer/head_interval")
    assert "line 2" in err.reason


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ("producer\n    head_interval = abc\n", 2, "producer/head_interval", "milliseconds, got 'abc'"),
        ("producer\n    head_interval = 1.5\n", 2, "producer/head_interval", "integer"),
        ("producer\n    head_interval =\n", 2, "producer/head_interval", "got ''"),
        ("producer\n    head_interval\n", 2, "producer/head_interval", "got ''"),
        ("producer\n    head_interval = 0\n", 2, "producer/head_interval", "at least 1"),
        ("producer\n    head_interval = -5\n", 2, "producer/head_interval", "at least 1"),
        ("producer\n    head_interval = +5\n", 2, "producer/head_interval", "without a sign"),
        ("store\n    retention\n        ms = -2\n", 3, "store/retention/ms", "at least -1"),
        ("store\n    high_watermark = 99999999999999999999\n", 2, "store/high_watermark", "range"),
        ("tower\n    verbose = maybe\n", 2, "tower/verbose", "boolean"),
        ("tower\n    verbose = 2\n", 2, "tower/verbose", "boolean"),
        ("consumer\n    offset\n        reset = newest\n", 3, "consumer/offset/reset",
         "'latest', 'earliest'"),
    ],
)
def test_bad_values_name_file_line_and_key(text, line, key, words):
    err = error_from_text(text, "cfg/dafka.cfg")
    assert (err.file, err.line, err.key) == ("cfg/dafka.cfg", line, key)
    assert words in err.reason
    assert str(err) == f"cfg/dafka.cfg:{line}: {key}: {err.reason}"


def test_bad_int_message_format():
    err = error_from_text("producer\n    verbose = 0\n    head_interval = abc\n", "cfg/dafka.cfg")
    assert str(err) == (
        "cfg/dafka.cfg:3: producer/head_interval: "
        "expected an integer number of milliseconds, got 'abc'"
    )


def test_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope" / "dafka.cfg"
    with pytest.raises(ConfigError) as info:
        Config.load(missing)
    assert info.value.file == str(missing)
    assert str(info.value) == f"no such config file: {missing}"


def test_unreadable_and_undecodable_files(tmp_path):
    with pytest.raises(ConfigError) as info:
        Config.load(tmp_path)  # a directory
    assert str(tmp_path) in str(info.value)
    path = tmp_path / "latin1.cfg"
    path.write_bytes(b"a = 1\nb = \xe9\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert (info.value.file, info.value.line) == (str(path), 2)


def test_unknown_key_in_file_warns_and_loads(caplog):
    text = "producer\n    head_interval = 500\n    head_intervall = 7\nother_tool\n    x = 1\nbeacon\n"
    with caplog.at_level(logging.WARNING, logger="dafka.config"):
        config = Config.from_text(text, "x.cfg")
    assert config["producer/head_interval"] == 500
    messages = [r.getMessage() for r in caplog.records if r.name == "dafka.config"]
    assert len(messages) == 2
    assert "x.cfg:3" in messages[0] and "producer/head_intervall" in messages[0]
    assert "producer/head_interval'" in messages[0]  # the suggestion
    assert "x.cfg:5" in messages[1] and "other_tool/x" in messages[1]


# --------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------


def test_overrides_beat_the_file(tmp_path):
    path = tmp_path / "dafka.cfg"
    path.write_text(REFERENCE_CFG)
    config = Config.load(path, overrides={"producer/head_interval": "250", "store/db": tmp_path / "db"})
    assert config["producer/head_interval"] == 250
    assert config["store/db"] == str(tmp_path / "db")
    assert config.source("producer/head_interval") == "override"
    assert config["consumer/offset/reset"] == "earliest"
    assert config.source("consumer/offset/reset") == f"{path}:11"

    cli = config.with_overrides(dict([parse_override("consumer/offset/reset=latest")]), "command line")
    assert cli["consumer/offset/reset"] == "latest"
    assert cli.source("consumer/offset/reset") == "command line"
    assert config["consumer/offset/reset"] == "earliest"  # the original is untouched


def test_typed_overrides():
    config = Config.from_text("", overrides={"tower/verbose": True, "producer/min_acks": 0,
                                             "store/sync": 1, "consumer/offset/reset": "Earliest"})
    assert config["tower/verbose"] is True
    assert config["producer/min_acks"] == 0
    assert config["store/sync"] is True
    assert config["consumer/offset/reset"] == "earliest"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("producer/head_interval", True),
        ("producer/head_interval", 1.5),
        ("producer/head_interval", "abc"),
        ("producer/min_acks", -1),
        ("tower/verbose", "maybe"),
        ("tower/verbose", 2),
        ("beacon/address", 5),
        ("beacon/address", "a\nb"),
        ("consumer/offset/reset", "newest"),
    ],
)
def test_bad_override_values(key, value):
    with pytest.raises(ConfigError) as info:
        Config().with_overrides({key: value}, "command line")
    assert (info.value.file, info.value.key) == ("command line", key)
    assert str(info.value).startswith(f"command line: {key}: ")


def test_unknown_override_key_suggests():
    with pytest.raises(ConfigError) as info:
        Config.load(overrides={"producer/head_intervl": 5})
    assert info.value.key == "producer/head_intervl"
    assert "did you mean 'producer/head_interval'" in str(info.value)
    with pytest.raises(ConfigError, match="did you mean 'producer/head_interval'"):
        Config().with_overrides({"head_interval": 5})


def test_parse_override():
    assert parse_override("producer/head_interval=500") == ("producer/head_interval", "500")
    assert parse_override("beacon/address = a=b ") == ("beacon/address", "a=b")
    assert parse_override("beacon/address=") == ("beacon/address", "")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("producer/head_interval")
    with pytest.raises(ConfigError, match="did you mean 'producer/head_interval'") as info:
        parse_override("producer/head_intreval=5")
    assert info.value.key == "producer/head_intreval"


# --------------------------------------------------------------------------
# Writing ZPL
# --------------------------------------------------------------------------


def test_to_zpl_round_trip():
    config = Config().with_overrides({
        "beacon/address": "it's \"quoted\"",
        "store/db": "/tmp/x # not a comment = really",
        "tower/sub_address": "it's",
        "store/retention/ms": 60000,
        "producer/verbose": True,
        "consumer/offset/reset": "earliest",
    })
    text = config.to_zpl()
    again = Config.from_text(text)
    assert again == config
    assert dict(again) == dict(config)
    assert set(parse_zpl(text)) == set(KEYS)
    assert Config.from_text(Config().to_zpl()) == Config()


def test_unwritable_string_is_rejected():
    with pytest.raises(ConfigError, match="cannot be written"):
        Config().with_overrides({"beacon/address": " both ' and \" "})


_INT_KEYS = [k for k in KEYS.values() if k.kind == "int"]


@st.composite
def int_overrides(draw) -> dict[str, int]:
    keys = draw(st.lists(st.sampled_from(_INT_KEYS), unique=True, max_size=len(_INT_KEYS)))
    return {
        k.path: draw(st.integers(min_value=k.minimum if k.minimum is not None else -(2**63),
                                 max_value=2**63 - 1))
        for k in keys
    }


@settings(max_examples=60, deadline=None)
@given(int_overrides())
def test_to_zpl_round_trips_random_ints(overrides):
    config = Config().with_overrides(overrides)
    assert Config.from_text(config.to_zpl()) == config


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20))
def test_to_zpl_round_trips_random_strings(value):
    try:
        config = Config().with_overrides({"store/db": value})
    except ConfigError:
        return  # not representable in ZPL, and said so
    assert Config.from_text(config.to_zpl())["store/db"] == value
