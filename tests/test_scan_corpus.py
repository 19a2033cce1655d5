"""Corpus files: each format read by its reader, hostile and broken files refused or counted in words, never
executed, never fatal."""

import io
import json
import pickle

import pytest

from attnviz.corpus.document_files import columns_of, read_corpus
from attnviz.corpus.documents import MAX_DOCUMENT_CHARS, CorpusRefused, bundled_corpus


def test_txt_by_line_and_by_paragraph(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffFirst line.\n\nSecond paragraph,\nstill second.\r\n\n\n  \nThird — ünïcode 🙂.\n".encode())
    by_line = read_corpus(path, split="line")
    assert [d.text for d in by_line.documents] == ["First line.", "Second paragraph,", "still second.",
                                                   "Third — ünïcode 🙂."]
    by_paragraph = read_corpus(path, split="paragraph")
    assert [d.text for d in by_paragraph.documents] == ["First line.", "Second paragraph,\nstill second.",
                                                        "Third — ünïcode 🙂."]
    assert by_paragraph.documents[1].source == "paragraph at line 3"
    assert by_line.fingerprint != by_paragraph.fingerprint
    assert read_corpus(path, split="line").fingerprint == by_line.fingerprint


def test_bad_lines_are_counted_not_fatal(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"good one\n\xff\xfe broken bytes\n" + b"x" * (MAX_DOCUMENT_CHARS + 1) + b"\nnul\x00 inside\n")
    corpus = read_corpus(path)
    assert [d.text for d in corpus.documents] == ["good one", "nul inside"]
    assert (corpus.report.undecodable, corpus.report.too_long, corpus.report.kept) == (1, 1, 2)
    assert corpus.report.lines() == ["1 document not valid UTF-8: left out",
                                     f"1 document longer than {MAX_DOCUMENT_CHARS:,} characters: left out"]


def test_jsonl_field_and_hostile_lines(tmp_path):
    lines = [json.dumps({"text": "one", "body": "uno"}), json.dumps({"text": 5}), json.dumps(["a list"]),
             "{not json", "[" * 100_000, json.dumps({"text": ""}), json.dumps({"body": "only body"}),
             json.dumps({"text": "two"})]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines))
    corpus = read_corpus(path)
    assert [d.text for d in corpus.documents] == ["one", "two"]
    assert corpus.report.not_text == 5 and corpus.report.empty == 1
    assert [d.text for d in read_corpus(path, field_name="body").documents] == ["uno", "only body"]
    assert columns_of(path) == ["text", "body"]


def test_csv_column_choice_quoting_and_broken_rows(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(b'id,text\n1,"hello, world"\n2,"multi\nline"\n3,\xff\xfe\n4,fine\n')
    corpus = read_corpus(path)
    assert [d.text for d in corpus.documents] == ["hello, world", "multi\nline", "fine"]
    assert corpus.report.undecodable == 1
    assert columns_of(path) == ["id", "text"]
    with pytest.raises(CorpusRefused, match="choose the column"):
        read_corpus(path, field_name="missing")
    (tmp_path / "two.csv").write_text("a,b\nx,y\n")
    with pytest.raises(CorpusRefused, match="'a', 'b'"):
        read_corpus(tmp_path / "two.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(CorpusRefused, match="no header"):
        read_corpus(tmp_path / "empty.csv")


def test_parquet_is_read_by_its_reader(tmp_path):
    import pandas as pd

    path = tmp_path / "c.parquet"
    pd.DataFrame({"text": ["alpha", None, "beta", "  "], "n": [1, 2, 3, 4]}).to_parquet(path)
    corpus = read_corpus(path)
    assert [d.text for d in corpus.documents] == ["alpha", "beta"]
    assert corpus.report.not_text == 1 and corpus.report.empty == 1
    assert columns_of(path) == ["text"]  # only text columns are offered
    with pytest.raises(CorpusRefused, match="choose the column that holds the text: this file has 'text'"):
        read_corpus(path, field_name="n")
    # nested columns: only the top-level text columns, never their parts ("element" of a list)
    nested = tmp_path / "nested.parquet"
    pd.DataFrame({"body": ["one", "two"], "tags": [["a", "b"], ["c"]], "id": [1, 2]}).to_parquet(nested)
    assert columns_of(nested) == ["body"]
    assert [d.text for d in read_corpus(nested).documents] == ["one", "two"]  # the one text column
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not a parquet file PAR1")
    for read in (read_corpus, columns_of):
        with pytest.raises(CorpusRefused, match="cannot be read") as refused:
            read(broken)
        assert str(tmp_path) not in str(refused.value)  # the server's path stays on the server


class Exploding:
    def __reduce__(self):
        return (print, ("pickle executed",))


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.csv", "corpus.txt", "corpus.parquet"])
def test_a_pickle_under_any_corpus_name_is_never_executed(name, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(Exploding()))
    try:
        corpus = read_corpus(path)
    except CorpusRefused:
        corpus = None
    assert "pickle executed" not in capsys.readouterr().out
    if corpus is not None:
        assert all("pickle executed" not in d.text for d in corpus.documents)


def test_wrong_formats_and_oversize_files_are_refused(tmp_path):
    with pytest.raises(CorpusRefused, match="not a corpus file"):
        read_corpus(tmp_path / "model.pkl")
    with pytest.raises(CorpusRefused, match="not a corpus file"):
        read_corpus(io.BytesIO(b"x"), "../../etc/passwd")
    big = tmp_path / "big.txt"
    big.write_bytes(b"word " * 1000)
    with pytest.raises(CorpusRefused, match="at most"):
        read_corpus(big, max_bytes=1000)
    with pytest.raises(CorpusRefused, match="over"):
        read_corpus(io.BytesIO(b"word " * 1000), "upload.txt", max_bytes=1000)
    assert read_corpus(io.BytesIO(b"one\ntwo"), "upload.txt").report.kept == 2


def test_the_bundled_corpus_mixes_topics_and_docstrings():
    corpus = bundled_corpus()
    assert len(corpus.documents) > 3000
    first = corpus.documents[:200]
    assert any(d.source.startswith("topics: ") for d in first)
    assert any(d.source.startswith("docstring: ") for d in first)
    assert bundled_corpus().fingerprint == corpus.fingerprint  # the same order every time
