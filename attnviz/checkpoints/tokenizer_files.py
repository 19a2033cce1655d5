"""The tokenizer's files of a model folder, checked before a tokenizer reads them: each a regular file within its
bound, vocabularies counted, sentencepiece models read piece by piece, and the tokenizer configs replaced by
copies without the keys that would make a tokenizer open a file by path."""

from __future__ import annotations

import json
from pathlib import Path

from attnviz.checkpoints.checked_files import CheckedFile, LinkRule, MiB, read_json, regular_file, shown
from attnviz.checkpoints.safety import CheckpointRefused

# Every file a tokenizer of transformers 5 may open, with its bound. The largest real ones: Gemma 3's
# tokenizer.json (33 MB), its tokenizer_config.json (1.2 MB), Qwen's vocab.json (2.7 MB) and merges.txt (1.7 MB).
TOKENIZER_LIMITS = {
    "tokenizer.json": 64 * MiB, "tokenizer_config.json": 4 * MiB, "special_tokens_map.json": 1 * MiB,
    "added_tokens.json": 4 * MiB, "chat_template.jinja": 1 * MiB, "chat_template.json": 1 * MiB,
    "vocab.txt": 16 * MiB, "vocab.json": 32 * MiB, "merges.txt": 32 * MiB, "dict.txt": 16 * MiB, "bpe.codes": 16 * MiB,
    "spiece.model": 32 * MiB, "sentencepiece.bpe.model": 32 * MiB, "sentencepiece.model": 32 * MiB,
    "tokenizer.model": 32 * MiB, "spm.model": 32 * MiB, "spm_char.model": 32 * MiB, "source.spm": 32 * MiB,
    "target.spm": 32 * MiB, "target_vocab.json": 32 * MiB, "vocab-src.json": 32 * MiB, "vocab-tgt.json": 32 * MiB,
    "entity_vocab.json": 32 * MiB, "tekken.json": 64 * MiB, "emoji.json": 4 * MiB, "normalizer.json": 4 * MiB,
    "byte_maps.json": 4 * MiB, "word_shape.json": 4 * MiB, "word_pronunciation.json": 4 * MiB,
}
TIKTOKEN_LIMIT = 16 * MiB  # *.tiktoken vocabularies (one token per line)
# Entries in one vocabulary file (lines, or JSON keys): real vocabularies stay under 300k; each entry costs a few
# hundred bytes once a tokenizer holds it, so 8M of them took 1.5 GB.
MAX_VOCABULARY_ENTRIES = 1_048_576

# tokenizer_config.json and special_tokens_map.json can name files: keys ending so (transformers 5.24 resolves the
# ones it knows from the folder itself, whatever the config says, but a tokenizer class may open others), and
# ``vocab`` / ``merges`` / ``rewriting_rules`` given as a string, which a tokenizer opens as a path (the Rust
# tokenizer reads /dev/zero until the process aborts). transformers reads a copy with such keys left out.
FILE_KEY_SUFFIXES = ("_file", "_files", "_path", "_dir", "_directory")
PATH_VALUED_KEYS = {"vocab", "merges", "rewriting_rules"}
LABEL_KEYS = {"name_or_path", "_name_or_path"}  # where a checkpoint came from: a label that transformers replaces
TEXT_KEYS = {"chat_template"}  # free text, never opened


def _looks_like_a_path(value: str) -> bool:
    parts = value.replace("\\", "/").split("/")
    return (value.startswith(("/", "~", "\\")) or (len(value) > 1 and value[1] == ":" and value[0].isalpha())
            or ".." in parts)


def sanitised_tokenizer_config(content: object) -> tuple[dict, list[str]]:
    """A tokenizer config without the keys that could make a tokenizer open a file by path, and the keys left out
    that named one (for the page); raises CheckpointRefused if it is not a JSON object."""
    if not isinstance(content, dict):
        raise CheckpointRefused("is not a JSON object")
    kept, named = {}, []
    for key, value in content.items():
        names_files = key.endswith(FILE_KEY_SUFFIXES) and key not in LABEL_KEYS
        path_valued = key in PATH_VALUED_KEYS and isinstance(value, str)
        path_like = (isinstance(value, str) and key not in LABEL_KEYS | TEXT_KEYS and not key.endswith("_token")
                     and _looks_like_a_path(value))
        if key == "auto_map" or names_files or path_valued or path_like:
            if value not in (None, "", [], {}) and key != "auto_map":
                named.append(shown(key, 30))
            continue
        kept[key] = value
    return kept, named


def _count_entries(checked: CheckedFile) -> int:
    """Entries of a vocabulary, counted in chunks without parsing it: lines of a text file; in JSON, keys
    (``"…":``, a vocabulary's entries) and closing brackets followed by a comma (``],``: a unigram vocabulary's
    pairs, a merges list's pairs)."""
    markers = (b'":', b"],") if checked.name.endswith(".json") else (b"\n",)
    count = 0
    with open(checked.real, "rb") as file:
        tail = b""
        while chunk := file.read(MiB):
            window = tail + chunk
            count += sum(window.count(marker) for marker in markers) - sum(tail.count(m) for m in markers)
            tail = chunk[-1:]
    return count


MAX_PIECE_WORK = 1_000_000_000  # sum of squared piece lengths: converting a sentencepiece model costs about this


def sentencepiece_problem(checked: CheckedFile) -> str | None:
    """Why a sentencepiece model (a protobuf) is too costly to read: too many pieces, or pieces so long that
    transformers' conversion to a fast tokenizer (every split of every piece, in Python) would run for hours."""
    data = checked.real.read_bytes()
    pieces = work = 0
    position = 0
    try:
        while position < len(data):
            key, position = _varint(data, position)
            field_number, wire = key >> 3, key & 7
            if wire == 2:
                length, position = _varint(data, position)
                if field_number == 1:  # a SentencePiece message: its field 1 is the piece
                    pieces += 1
                    piece_length = _first_string_length(data, position, position + length)
                    work += piece_length * piece_length
                position += length
            elif wire == 0:
                _, position = _varint(data, position)
            elif wire in (1, 5):
                position += 8 if wire == 1 else 4
            else:
                return "it is not a sentencepiece model"
    except IndexError:
        return "it is not a sentencepiece model"
    if pieces > MAX_VOCABULARY_ENTRIES:
        return f"it has more than {MAX_VOCABULARY_ENTRIES:,} pieces"
    if work > MAX_PIECE_WORK:
        return "its pieces are so long that reading them would take hours"
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _first_string_length(data: bytes, start: int, end: int) -> int:
    position = start
    while position < end:
        key, position = _varint(data, position)
        if key & 7 == 2:
            length, position = _varint(data, position)
            if key >> 3 == 1:
                return length
            position += length
        elif key & 7 == 0:
            _, position = _varint(data, position)
        else:
            position += 8 if key & 7 == 1 else 4
    return 0


SENTENCEPIECE_SUFFIXES = (".model", ".spm")
COUNTED_JSON = {"tokenizer.json", "tekken.json", "vocab.json", "target_vocab.json", "vocab-src.json", "vocab-tgt.json"}


def check_tokenizer(folder: Path, links: LinkRule) -> tuple[list[CheckedFile], str | None, list[str]]:
    """The folder's tokenizer files, each a checked regular file within its bound, or ``([], why, notes)``: then
    no tokenizer file is read at all (a stand-in tokenizer is used, and the page says why). The tokenizer configs
    are replaced in the view by copies without keys that name files (listed in the notes)."""
    found, notes = [], []
    names = list(TOKENIZER_LIMITS) + sorted(p.name for p in folder.iterdir() if p.name.endswith(".tiktoken"))
    for name in names:
        limit = TOKENIZER_LIMITS.get(name, TIKTOKEN_LIMIT)
        try:
            checked = regular_file(folder, name, links)
        except CheckpointRefused as problem:
            return [], f"Its tokenizer file {problem}", notes
        if checked is None:
            continue
        if checked.size > limit:
            return [], (f"Its tokenizer file {shown(name)} is {checked.size / MiB:.1f} MiB, larger than "
                        f"{limit / MiB:g} MiB, so it was not read"), notes
        counted = name.endswith((".txt", ".codes", ".tiktoken")) or name in COUNTED_JSON
        # A merges list holds about one pair per vocabulary entry: JSON vocabularies may hold both.
        allowed = 2 * MAX_VOCABULARY_ENTRIES if name in ("tokenizer.json", "tekken.json") else MAX_VOCABULARY_ENTRIES
        if counted and _count_entries(checked) > allowed:
            return [], (f"Its tokenizer file {shown(name)} has more than {allowed:,} entries, so it was not "
                        "read"), notes
        if name.endswith(SENTENCEPIECE_SUFFIXES):
            problem = sentencepiece_problem(checked)
            if problem:
                return [], f"Its tokenizer file {shown(name)} cannot be used: {problem}", notes
        if name in ("tokenizer_config.json", "special_tokens_map.json"):
            try:
                content, named = sanitised_tokenizer_config(read_json(checked, limit))
            except CheckpointRefused as refused:
                return [], f"Its tokenizer file {name} {refused}", notes
            if named:
                notes.append(f"Left out of {name}: {', '.join(named)} (it named files by path; the tokenizer reads "
                             "its files from the checkpoint's own folder only)")
            checked.replacement = json.dumps(content).encode()
        found.append(checked)
    return found, None, notes
