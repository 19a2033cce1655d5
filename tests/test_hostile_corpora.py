"""Crafted corpus files, each read the way the page reads it: in a child process with a memory and CPU cap
(:func:`attnviz.corpus.document_probe.probe`), in bounded time. Each is refused in words or read within its bounds
(what is past a bound counted, never kept); the child's peak memory is checked against a stated bound."""

import json
import time

import pytest

from attnviz.corpus import documents as corpus
from attnviz.corpus.document_files import MAX_LINE_BYTES, read_corpus
from attnviz.corpus.document_probe import probe
from attnviz.corpus.documents import MAX_RECORDS, CorpusRefused

PEAK_BOUND = 700 * 1024**2  # what reading any of these may take in the child (Python and pyarrow: ~330 MB)
SECONDS = 60.0


def probed(path, **options) -> dict:
    started = time.monotonic()
    facts = probe(path, "facts", **options)
    assert time.monotonic() - started < SECONDS
    assert 0 < facts["peak_bytes"] < PEAK_BOUND, facts["peak_bytes"]
    return facts


@pytest.fixture
def few_characters(monkeypatch):
    """A small character budget (the child inherits it), so that a bomb reaches it in a few MB."""
    monkeypatch.setenv("ATTNVIZ_CORPUS_CHARS", "3000000")
    return 3_000_000


def test_a_parquet_dictionary_bomb_is_read_to_the_character_budget_and_counted(tmp_path, few_characters):
    """535 bytes of zstd, dictionary-encoded Parquet: one 100,000-character string repeated 40,000 times (4 billion
    characters once decoded). Only the budget's worth becomes documents; the rest are counted without being made
    strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bomb.parquet"
    values = pa.array(["x" * corpus.MAX_DOCUMENT_CHARS] * 40_000).dictionary_encode()
    pq.write_table(pa.table({"text": values}), path, compression="zstd", row_group_size=40_000)
    assert path.stat().st_size < 2_000
    facts = probed(path)
    kept = few_characters // corpus.MAX_DOCUMENT_CHARS
    assert facts["documents"] == kept and facts["characters"] == kept * corpus.MAX_DOCUMENT_CHARS
    assert facts["report"] == [f"{40_000 - kept:,} documents after the first {few_characters:,} characters of "
                               "documents: left out"]


def test_a_parquet_value_that_decompresses_past_the_chunk_bound_is_refused_before_it_is_read(tmp_path,
                                                                                           monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("ATTNVIZ_PARQUET_CHUNK_MB", "8")
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["y" * 12_000_000, "fine"]}), path, compression="zstd")
    assert path.stat().st_size < 100_000
    with pytest.raises(CorpusRefused, match="decompresses to 11.4 MB in row group 0; attnviz reads chunks of at "
                                            "most 8 MB"):
        probe(path, "facts")


def test_millions_of_short_lines_stop_at_the_record_limit_and_the_rest_is_counted(tmp_path):
    """A .txt of two-character lines (the page used to keep every line as an object: 522 MB for 16 MB)."""
    path = tmp_path / "lines.txt"
    path.write_bytes(b"ab\n" * (MAX_RECORDS + 150_000))
    facts = probed(path)
    assert facts["documents"] == MAX_RECORDS
    assert facts["report"] == [f"150,000 more lines past the first {MAX_RECORDS:,} of the file: not read"]


def test_a_jsonl_of_empty_objects_is_parsed_only_to_the_record_limit(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"{}\n" * (MAX_RECORDS + 20_000))
    facts = probed(path)
    assert facts["documents"] == 0
    assert facts["report"] == [f"{MAX_RECORDS:,} documents not text (a missing field, a number, a list…): left out",
                               f"20,000 more lines past the first {MAX_RECORDS:,} of the file: not read"]


def test_a_lone_surrogate_is_an_undecodable_document_not_a_failure(tmp_path):
    path = tmp_path / "surrogate.jsonl"
    path.write_text(json.dumps({"text": "\ud800 broken"}) + "\n" + json.dumps({"text": "fine"}) + "\n")
    facts = probed(path)
    assert facts["documents"] == 1 and facts["report"] == ["1 document not valid UTF-8: left out"]
    read = read_corpus(path)
    assert [d.text for d in read.documents] == ["fine"] and read.report.undecodable == 1


def test_a_line_far_longer_than_a_document_is_skipped_without_being_held(tmp_path):
    path = tmp_path / "long.txt"
    with open(path, "wb") as handle:
        handle.write(b"first\n")
        handle.write(b"z" * (3 * MAX_LINE_BYTES) + b"\n")
        handle.write(b"last\n")
    facts = probed(path)
    assert facts["documents"] == 2 and facts["report"] == [
        f"1 document longer than {corpus.MAX_DOCUMENT_CHARS:,} characters: left out"]
    paragraphs = probed(path, split="paragraph")
    assert paragraphs["documents"] == 0 and paragraphs["report"] == [
        f"1 document longer than {corpus.MAX_DOCUMENT_CHARS:,} characters: left out"]


def test_a_csv_with_an_unclosed_quote_is_refused_in_words(tmp_path):
    path = tmp_path / "quote.csv"
    with open(path, "wb") as handle:
        handle.write(b'text\n"never closed\n')
        for _ in range(MAX_LINE_BYTES // 1000 + 10):
            handle.write(b"a" * 999 + b"\n")
    with pytest.raises(CorpusRefused, match="a field of more than 400,000 characters ending at line 402 "
                                            "\\(an unclosed quote\\?\\)"):
        probe(path, "facts")
    # a quoted field of short fields on many lines: the row's bytes are bounded too
    many = tmp_path / "fields.csv"
    with open(many, "wb") as handle:
        handle.write(b"text,other\n")
        for _ in range(MAX_LINE_BYTES // 10_000 + 10):
            handle.write(b'"a",' * 2_500 + b'"\n')
    with pytest.raises(CorpusRefused, match="a row of more than 4 MB|field of more than"):
        probe(many, "facts")


def test_a_csv_of_many_short_rows_stops_at_the_record_limit(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(b"text\n" + b"hi\n" * (MAX_RECORDS + 5))
    facts = probed(path)
    assert facts["documents"] == MAX_RECORDS - 1  # the header is the first line
    assert facts["report"] == [f"6 more lines past the first {MAX_RECORDS:,} of the file: not read"]


def test_a_child_that_passes_its_memory_cap_is_a_refusal_in_words(tmp_path, monkeypatch):
    """Whatever a reader's own bounds miss, the child's cap holds: with the chunk bound lifted, a 10 KB file whose
    one value decompresses to 300 MB meets a 500 MB cap, and the page gets a refusal in words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("ATTNVIZ_PARQUET_CHUNK_MB", "4096")
    monkeypatch.setenv("ATTNVIZ_CORPUS_READER_MB", "500")
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["y" * 300_000_000, "fine"]}), path, compression="zstd")
    assert path.stat().st_size < 20_000
    started = time.monotonic()
    with pytest.raises(CorpusRefused, match="cannot be read: .*malloc|memory"):
        probe(path, "facts")
    assert time.monotonic() - started < SECONDS


def test_the_page_reads_a_bomb_in_the_child_and_says_what_it_left_out(tmp_path, few_characters,
                                                                    clean_streamlit_caches):
    """Through the page: the corpus upload is read in the child, the report shown, the server's memory untouched
    (the documents are never kept in it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.apptest_helpers import open_page

    path = tmp_path / "bomb.parquet"
    values = pa.array(["x" * corpus.MAX_DOCUMENT_CHARS] * 40_000).dictionary_encode()
    pq.write_table(pa.table({"text": values}), path, compression="zstd", row_group_size=40_000)
    at = open_page("app_pages/corpus.py")
    at.radio(key="corpus_source").set_value("Upload a file").run()
    at.get("file_uploader")[0].set_value(("bomb.parquet", path.read_bytes(), "application/octet-stream"))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(c.value for c in at.caption)
    assert "39,970 documents after the first 3,000,000 characters of documents: left out" in said
    assert at.button(key="corpus_scan").label == "Scan 30 documents"


def test_a_document_the_tokenizer_refuses_is_left_out_of_the_scan_not_fatal(bert, tmp_path):
    """Whatever reaches a scan (here a lone surrogate put in by hand, past the readers), a document the tokenizer
    refuses is listed with its problem and left out; the others are scanned, and a resume does not trip on it."""
    from attnviz.corpus.documents import Corpus, Document
    from attnviz.corpus.scan import store
    from attnviz.corpus.scan.runner import REFUSED_BY_TOKENIZER, ScanSettings, run_scan

    documents = [Document("The cat sat on the mat.", "1"), Document("\ud800 broken", "2"),
                 Document("It was tired.", "3")]
    settings = ScanSettings(max_docs=3, max_tokens=16, chunk_docs=1, qk_points=8)
    state = run_scan(Corpus("c", documents), bert, tmp_path / "scan.duckdb", settings, should_stop=lambda: False)
    assert state.status == store.STATUS_FINISHED
    with store.ScanReader(tmp_path / "scan.duckdb") as reader:
        rows = reader.connection.execute("SELECT doc, n_tokens, problem FROM documents ORDER BY doc").fetchall()
    assert rows[0][2] is None and rows[2][2] is None and rows[0][1] > 0
    assert rows[1][2].startswith(REFUSED_BY_TOKENIZER) and rows[1][1] == 0
    again = run_scan(Corpus("c", documents), bert, tmp_path / "scan.duckdb", settings)
    assert again.status == store.STATUS_FINISHED


def test_blank_values_just_under_the_cut_cost_little_and_are_bounded(tmp_path, few_characters):
    """670 bytes of Parquet: 100,000 values of 101,000 spaces, each emptied by stripping (so they never counted
    against the kept characters): what is looked at is bounded too (twice the budget)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "spaces.parquet"
    values = pa.array([" " * 101_000] * 100_000).dictionary_encode()
    pq.write_table(pa.table({"text": values}), path, compression="zstd", row_group_size=100_000)
    started = time.monotonic()
    facts = probed(path)
    assert time.monotonic() - started < 20
    looked = 2 * few_characters // 101_000
    assert facts["documents"] == 0
    assert facts["report"] == [f"{looked:,} documents empty: left out",
                               f"{100_000 - looked:,} documents after the first {few_characters:,} characters of "
                               "documents: left out"]


def test_a_parquet_value_that_is_not_utf8_is_counted_not_fatal(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = b"good" + b"\xff\xfe" + b"fine"
    offsets = pa.py_buffer(__import__("struct").pack("<4i", 0, 4, 6, 10))
    values = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(data)])
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": values}), path)
    read = read_corpus(path)
    assert [d.text for d in read.documents] == ["good", "fine"] and read.report.undecodable == 1
