"""Each token's text and UTF-8 bytes as log probabilities report them (``TokenTexts``),
read from the tokenizer's vocabulary, on either engine."""

from __future__ import annotations

import codecs
import re
from typing import Any


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's bytes_to_unicode), character to byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: b for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


BYTE_OF = _byte_decoder()
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """A token's text and UTF-8 bytes as the log probabilities report them: the bytes
    the tokenizer maps it to (byte-level BPE's alphabet, SentencePiece's ``▁`` and
    ``<0xNN>`` byte pieces; else its decoded text), and the text of those bytes (a
    token that ends inside a character shows the torn bytes escaped: ``\\xe2``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.byte_level = "ByteLevel" in repr(decoder)
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        hit = self.cache.get(tid)
        if hit is None:
            raw = self.raw(tid)
            hit = self.cache[tid] = (raw.decode("utf-8", "backslashreplace"), list(raw))
        return hit

    def raw(self, tid: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(tid)
        if isinstance(piece, str):
            if self.byte_level and all(c in BYTE_OF for c in piece):
                return bytes(BYTE_OF[c] for c in piece)
            if m := BYTE_PIECE.fullmatch(piece):
                return bytes([int(m.group(1), 16)])
            if "\u2581" in piece:
                return piece.replace("\u2581", " ").encode()
        return str(self.tokenizer.decode([tid])).encode()

    def offsets(self, ids: list[int]) -> list[int]:
        """Where each token's text starts in the text of ``ids`` (characters)."""
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        out, n = [], 0
        for t in ids:
            out.append(n)
            n += len(dec.decode(bytes(self(t)[1])))
        return out
