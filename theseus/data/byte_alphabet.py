"""GPT-2's byte-level alphabet: the printable character that stands for each byte in a byte-level
BPE vocabulary (``tokenizers``' ``ByteLevel``), so that every byte string is spelled in text."""

from __future__ import annotations


def _byte_symbols() -> list[str]:
    """The printable character GPT-2's byte-level alphabet gives each byte 0..255, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(range(256, 512))
    return [chr(b if b in printable else next(others)) for b in range(256)]


BYTE_SYMBOLS = _byte_symbols()  # byte b -> its character
