"""The GPT-2 byte-to-character table of byte-level BPE (Radford et al. 2019), in one place: the recorder
spells a vocabulary piece's bytes with it (tokengrad.record.token_text) and the read side turns raw
byte-level pieces back into characters (tokengrad.read.token_text). Standard library only, so record/ may
import it (tests/import_rules.py, LAYOUT).

    byte_level_table()["Ġ"]      # 0x20: a space
    byte_level_table()["Ł"]      # 0x9F
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def byte_level_table() -> dict[str, int]:
    """character -> byte: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100
    onwards, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, shift = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table
