"""How the console shows a record's value: as JSON, msgpack, text or hex,
guessed from the bytes and switchable.  Values are hostile input: nothing
here makes markup; the templates escape what these functions return."""

from __future__ import annotations

import json
from typing import Any

import msgpack

FORMATS = ("auto", "json", "msgpack", "text", "hex")
PREVIEW = 4096  # bytes of a value shown at most (the rest is counted)


def _json(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"))


def _msgpack(raw: bytes) -> Any:
    value = msgpack.unpackb(raw, raw=False, strict_map_key=False, max_bin_len=PREVIEW, max_ext_len=PREVIEW)
    if isinstance(value, (int, float, bool)) or value is None:
        raise ValueError("a scalar: more likely text or binary than msgpack")
    return value


def _plain(value: Any) -> Any:
    """msgpack's bytes and ext values as something JSON shows."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "data": value.data.hex()}
    return value


def hexdump(raw: bytes) -> str:
    lines = []
    for at in range(0, min(len(raw), PREVIEW), 16):
        chunk = raw[at:at + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {text}")
    return "\n".join(lines)


def render(raw: bytes, fmt: str = "auto") -> tuple[str, str]:
    """(the format used, the text to show) for a value; ``fmt`` "auto" picks JSON if it parses, then text if it
    is UTF-8 without control characters, then msgpack if it parses to a map or list, else hex."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    cut = raw[:PREVIEW]
    if fmt in ("auto", "json"):
        try:
            return "json", json.dumps(_json(raw), indent=2, ensure_ascii=False)[:4 * PREVIEW]
        except (UnicodeDecodeError, ValueError):
            if fmt == "json":
                return "hex", hexdump(raw)
    if fmt in ("auto", "text"):
        try:
            text = cut.decode("utf-8")
            if fmt == "text" or all(c.isprintable() or c in "\n\r\t" for c in text):
                return "text", text
        except UnicodeDecodeError:
            if fmt == "text":
                return "text", cut.decode("utf-8", errors="replace")
    if fmt in ("auto", "msgpack"):
        try:
            return "msgpack", json.dumps(_plain(_msgpack(raw)), indent=2, ensure_ascii=False, default=repr)
        except Exception:  # noqa: BLE001 - msgpack raises many kinds of errors for what is not msgpack
            if fmt == "msgpack":
                return "hex", hexdump(raw)
    return "hex", hexdump(raw)


def key_text(raw: bytes | None) -> str | None:
    """A record's key as a page shows it: its text if it is printable UTF-8, else its bytes in hex, at most
    200 characters; None for a record without a key."""
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
        if text.isprintable():
            return text[:200]
    except UnicodeDecodeError:
        pass
    return "0x " + raw[:66].hex(" ")


def matches(raw: bytes, needle: bytes) -> bool:
    """Whether a search finds ``needle`` in a value (bytes, case-sensitive)."""
    return needle in raw
