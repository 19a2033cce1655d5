"""One way to show a token on every page: tokenizers' raw pieces as readable text with visible marks.

Tokenizers store pieces in their own alphabets: byte-level BPE (GPT-2, RoBERTa, Llama 3, Qwen) writes each byte as
a printable character ("Ġthe" is " the", "Ċ" a newline, "Ã©" the two bytes of "é"); SentencePiece (T5, Llama 2,
Gemma) writes a leading space as "▁" and unknown bytes as "<0x0A>"; WordPiece (BERT) marks a word's continuation
with "##". Shown raw, the same token reads differently on two pages and a newline is invisible. Here every piece
becomes its text, with a space that cannot be seen (leading, trailing, or a line's indentation) shown as
``SPACE_MARK``, a newline as ``NEWLINE_MARK``, a tab as ``TAB_MARK``, a byte that is not a whole character alone
as ``<0xNN>``, and other invisible characters (a carriage return, a zero-width space) by their code. WordPiece's
"##" is kept: it already reads as "continues the word before". Raw strings and ids stay in exports and hovers
(:func:`piece_note`).
"""

from __future__ import annotations

import re
import unicodedata
import weakref
from functools import lru_cache

SPACE_MARK = "␣"
NEWLINE_MARK = "↵"
TAB_MARK = "⇥"
SENTENCEPIECE_SPACE = "▁"

BYTE_LEVEL = "byte-level BPE"
SENTENCEPIECE = "SentencePiece"
WORDPIECE = "WordPiece"
PLAIN = "plain"


@lru_cache(maxsize=1)
def _byte_of_character() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the printable character each of the 256 bytes is written as."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, characters, strict=True)}


def _invisible(character: str) -> str:
    """A control or format character (carriage return, NUL, zero-width space, ...) as ``<0xNN>`` or ``<U+XXXX>``;
    any other character as itself."""
    if unicodedata.category(character) not in ("Cc", "Cf"):
        return character
    code = ord(character)
    return f"<0x{code:02X}>" if code < 0x100 else f"<U+{code:04X}>"


def _marked(text: str) -> str:
    """Spaces that cannot be seen (at the start or end of a piece, or beside a newline or tab: "ĊĠĠ", a newline
    and a line's indentation), newlines and tabs anywhere, as visible marks (a space between two visible characters
    stays a space); other invisible characters by their code; a byte that is not a whole character (a lone
    surrogate from ``surrogateescape``) as ``<0xNN>``."""
    body = text.replace("\r\n", NEWLINE_MARK).replace("\n", NEWLINE_MARK).replace("\t", TAB_MARK)
    body = _UNSEEN_SPACES.sub(lambda spaces: SPACE_MARK * len(spaces.group()), body)
    if body.isprintable():
        return body
    shown = []
    for character in body:
        code = ord(character)
        shown.append(f"<0x{code - 0xDC00:02X}>" if 0xDC80 <= code <= 0xDCFF else _invisible(character))
    return "".join(shown)


# Runs of spaces at the start or end of a piece, or next to a newline or a tab mark.
_UNSEEN_SPACES = re.compile(f"^ +| +$|(?<=[{NEWLINE_MARK}{TAB_MARK}]) +| +(?=[{NEWLINE_MARK}{TAB_MARK}])")


def _byte_level_text(piece: str) -> str | None:
    """A byte-level piece as text, marks added; None when a character is outside the byte alphabet (a special
    token such as ``<|endoftext|>`` is written in ordinary characters and decodes as itself). Bytes that are part
    of a character whose other bytes are in a neighbouring token read ``<0xNN>``; whole characters around them
    read as text."""
    table = _byte_of_character()
    if any(character not in table for character in piece):
        return None
    data = bytes(table[character] for character in piece)
    return _marked(data.decode("utf-8", errors="surrogateescape"))


def _sentencepiece_text(piece: str) -> str:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # byte fallback
        try:
            byte = int(piece[3:5], 16)
        except ValueError:
            return piece
        return _marked(chr(byte)) if byte < 0x80 else piece  # a byte of a longer character stays <0xNN>
    return _marked(piece.replace(SENTENCEPIECE_SPACE, " "))


def readable_token(piece: str, style: str) -> str:
    """``piece`` (a tokenizer's raw token string) as readable text for a tokenizer of ``style``
    (:func:`tokenizer_style`). Never empty: an empty piece reads as ``∅``."""
    if style == BYTE_LEVEL:
        text = _byte_level_text(piece)
        shown = piece if text is None else text
    elif style == SENTENCEPIECE:
        shown = _sentencepiece_text(piece)
    else:
        shown = _marked(piece)
    return shown or "∅"


def readable_tokens(pieces: list[str], style: str) -> list[str]:
    """:func:`readable_token` of each piece (computed once per capture: pages label with the result)."""
    return [readable_token(piece, style) for piece in pieces]


def piece_note(piece: str, token_id: int | None = None) -> str:
    """What a hover adds to a readable token: the tokenizer's raw piece (quoted, escapes visible) and its id."""
    note = f"piece {piece!r}"
    return note if token_id is None else f"{note}, id {token_id}"


_STYLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its style, read once


def tokenizer_style(tokenizer) -> str:
    """How ``tokenizer`` writes its pieces, read from its own normalizer, pre-tokenizer, decoder and model (a fast
    tokenizer's ``backend_tokenizer``), else from a slow tokenizer's attributes or its vocabulary: BYTE_LEVEL,
    SENTENCEPIECE, WORDPIECE or PLAIN (a stand-in tokenizer, a word-level vocabulary). Read once per tokenizer."""
    try:
        return _STYLES[tokenizer]
    except (KeyError, TypeError):  # not read yet, or a tokenizer that cannot be a weak key
        pass
    style = _style_of(tokenizer)
    try:
        _STYLES[tokenizer] = style
    except TypeError:
        pass
    return style


def _style_of(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The parts' reprs are short (a model's repr would print its vocabulary: only its class is read).
        parts = " ".join(repr(getattr(backend, part, None)) for part in ("normalizer", "pre_tokenizer", "decoder"))
        model = type(getattr(backend, "model", None)).__name__
        if "ByteLevel" in parts:
            return BYTE_LEVEL
        # Llama 2 and Gemma write "▁" in their normalizer or decoder (no Metaspace); T5's Unigram uses Metaspace.
        if "Metaspace" in parts or SENTENCEPIECE_SPACE in parts or "ByteFallback" in parts or model == "Unigram":
            return SENTENCEPIECE
        if "WordPiece" in parts or model == "WordPiece":
            return WORDPIECE
    if hasattr(tokenizer, "byte_encoder"):  # a slow GPT-2 or RoBERTa tokenizer
        return BYTE_LEVEL
    if hasattr(tokenizer, "sp_model") or any("sentencepiece" in kind.__name__.lower()
                                             for kind in type(tokenizer).__mro__):
        return SENTENCEPIECE
    if hasattr(tokenizer, "wordpiece_tokenizer"):  # a slow BERT tokenizer
        return WORDPIECE
    vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    sample = list(vocabulary)[:5000]
    if sum(piece.startswith("Ġ") for piece in sample) > 50:
        return BYTE_LEVEL
    if sum(piece.startswith(SENTENCEPIECE_SPACE) for piece in sample) > 50:
        return SENTENCEPIECE
    if sum(piece.startswith("##") for piece in sample) > 50:
        return WORDPIECE
    return PLAIN


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~$])")


def markdown_literal(text: str) -> str:
    """``text`` (a token's label, a snippet of what the user typed) to be read as itself inside Streamlit's
    Markdown: every character Markdown (or its LaTeX and colour syntax) would read is escaped with a backslash."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)
