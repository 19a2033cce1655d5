"""DuckDB files anyone could have written (a scan in ATTNVIZ_SCAN_ROOT, ``scan:FILE``): opened read-only with
external access off and the configuration locked, and refused when they hold a view, macro, table or column of
their own, so that no file of the server is read through them. And the page deletes a scan's files only when they
are positively not a scan, never after a lock conflict: it says "busy" instead."""

import shutil
import subprocess
import sys

import duckdb
import pytest

from attnviz.corpus import database
from attnviz.corpus.documents import Corpus, CorpusRefused, Document
from attnviz.corpus.importance.runner import read_corpus_spec
from attnviz.corpus.scan import store
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from tests.test_scan import TEXTS

SECRET = "the server's private notes: do not show"


@pytest.fixture(scope="module")
def genuine(bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("genuine")
    corpus = Corpus("tests", [Document(text, f"line {i + 1}") for i, text in enumerate(TEXTS)])
    run_scan(corpus, bert, root / "scan.duckdb", ScanSettings(max_docs=4, max_tokens=12, qk_points=0))
    return root / "scan.duckdb"


def tampered(genuine, folder, *statements) -> str:
    """A copy of a genuine scan with ``statements`` run on it (as someone who could write the file would)."""
    path = folder / "tampered.duckdb"
    shutil.copy(genuine, path)
    with duckdb.connect(str(path)) as connection:
        for statement in statements:
            connection.execute(statement)
    return str(path)


def secret_file(folder):
    path = folder / "secret.txt"
    path.write_text(SECRET)
    return path


def test_a_genuine_scan_reads_and_external_access_is_off_in_it(genuine):
    with store.ScanReader(genuine) as reader:
        assert reader.documents == 4
        with pytest.raises(duckdb.Error, match="disabled by configuration"):
            reader.connection.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()
        with pytest.raises(duckdb.Error, match="locked"):
            reader.connection.execute("SET enable_external_access = true")


@pytest.mark.parametrize("what", ["documents view", "statistics view", "macro", "table", "column", "sequence"])
def test_a_scan_file_holding_more_than_a_scans_schema_is_refused(genuine, tmp_path, what):
    secret = secret_file(tmp_path)
    reads = f"read_text('{secret}')"
    statements = {
        "documents view": ["DROP TABLE documents", f"CREATE VIEW documents AS SELECT 0 AS doc, filename AS source, "
                                                   f"content AS text, 1 AS n_chars, 1 AS n_tokens, false AS "
                                                   f"truncated, NULL AS problem FROM {reads}"],
        "statistics view": [f"CREATE OR REPLACE VIEW head_stats AS SELECT content AS mean FROM {reads}"],
        "macro": [f"CREATE MACRO peek() AS TABLE SELECT * FROM {reads}"],
        "table": ["CREATE TABLE notes AS SELECT 'x' AS note"],
        "column": ["ALTER TABLE tokens ADD COLUMN extra VARCHAR"],
        "sequence": ["CREATE SEQUENCE counter"],
    }[what]
    path = tampered(genuine, tmp_path, *statements)
    with pytest.raises(database.NotAResultsFile, match="it holds what a scan's database does not") as refused:
        store.ScanReader(path)
    assert not refused.value.missing  # never deleted for it: the page says what it found
    with pytest.raises(CorpusRefused) as refused:  # "Does this head matter?" over a scan's documents
        read_corpus_spec(f"scan:{path}")
    assert SECRET not in str(refused.value)


def test_a_file_that_is_not_a_database_or_lacks_a_scans_tables_is_missing_its_scan(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(database.NotAResultsFile) as refused:
        store.ScanReader(junk)
    assert refused.value.missing
    empty = tmp_path / "cut.duckdb"
    with duckdb.connect(str(empty)):
        pass  # created, cut short before its schema was written
    with pytest.raises(database.NotAResultsFile, match="no settings, documents table") as refused:
        store.ScanReader(empty)
    assert refused.value.missing


def test_an_importance_run_file_is_checked_against_its_own_schema(tmp_path):
    from attnviz.corpus.importance import store as importance_store


    path = tmp_path / "run.duckdb"
    with importance_store.ImportanceWriter(path) as writer:
        writer.set(key="k", status="finished")
    with importance_store.ImportanceReader(path) as reader:
        assert reader.settings["key"] == "k"
    with duckdb.connect(str(path)) as connection:
        connection.execute(f"CREATE VIEW leak AS SELECT * FROM read_text('{secret_file(tmp_path)}')")
    with pytest.raises(database.NotAResultsFile, match="view main.leak"):
        importance_store.ImportanceReader(path)


def test_a_hostile_scan_in_the_scan_root_is_shown_as_not_a_scan_and_nothing_of_the_file_it_names(
        genuine, tmp_path, monkeypatch, clean_streamlit_caches):
    from tests.apptest_helpers import open_page

    secret = secret_file(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    tampered(genuine, root, "DROP TABLE documents",
             f"CREATE VIEW documents AS SELECT 0 AS doc, filename AS source, content AS text, 1 AS n_chars, "
             f"1 AS n_tokens, false AS truncated, NULL AS problem FROM read_text('{secret}')")
    monkeypatch.setenv("ATTNVIZ_SCAN_ROOT", str(root))
    at = open_page("app_pages/corpus.py")
    assert at.selectbox(key="corpus_scan_choice").options == ["tampered.duckdb (not a scan)"]
    shown = " ".join(e.value for e in at.error)
    assert "tampered.duckdb cannot be read as a scan" in shown and "holds what a scan's database does not" in shown
    everything = " ".join(str(element.value) for kind in ("markdown", "caption", "error", "info", "warning")
                          for element in at.get(kind))
    assert SECRET not in everything and str(tmp_path) not in shown
    at = open_page("app_pages/importance.py")  # its corpus choices list the scan; measuring over it is refused
    assert not at.exception


def _this_browsers_scan(at, documents: int, tokens: int):
    """Where the corpus page of this AppTest keeps the scan of the bundled corpus with these limits."""
    from attnviz.checkpoints.keep import BrowserStore
    from attnviz.corpus.document_probe import facts_of
    from attnviz.corpus.scan.runner import scan_key
    from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models

    settings = ScanSettings(max_docs=documents, max_tokens=tokens, qk_points=0)
    key = scan_key(facts_of(None)["fingerprint"], bundled_models()[DEFAULT_MODEL_NAME], settings, "float32")
    folder = BrowserStore(at.session_state["browser_key"]).folder / "scans"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{key}.duckdb"


def test_a_scan_locked_by_a_writer_is_busy_never_deleted_and_only_a_non_scan_is_cleared(clean_streamlit_caches):
    from tests.apptest_helpers import open_page

    def visit(**state):
        at = open_page("app_pages/corpus.py", **state)
        at.number_input(key="corpus_docs").set_value(2)
        at.number_input(key="corpus_tokens").set_value(16)
        at.number_input(key="corpus_qk_points").set_value(0)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    at = visit()
    browser = at.session_state["browser_key"]  # the same browser comes back in each visit below
    path = _this_browsers_scan(at, 2, 16)
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(path)!r}); "
                               "c.execute('CREATE TABLE settings (key VARCHAR, value VARCHAR)'); print('held', "
                               "flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        at = visit(browser_key=browser)
        assert any("is busy (it is being written now): try again" in w.value for w in at.warning), (
            [w.value for w in at.warning], [e.value for e in at.error])
        assert path.is_file()  # a lock conflict deletes nothing
        assert not any(b.key == "corpus_scan" for b in at.button)
    finally:
        holder.kill()
        holder.wait()
    # a file that holds more than a scan: said, not deleted (nobody but attnviz writes here: someone tampered)
    with duckdb.connect(str(path)) as connection:
        connection.execute("CREATE TABLE documents (doc INTEGER)")
        connection.execute("CREATE TABLE extra (x INTEGER)")
    at = visit(browser_key=browser)
    assert any("cannot be read" in e.value for e in at.error) and path.is_file()
    # a file that is not a scan at all (cut short as it was created): cleared, and a new scan offered
    path.write_bytes(b"")
    at = visit(browser_key=browser)
    assert not path.exists() and at.button(key="corpus_scan").label == "Scan 2 documents"


def test_a_generated_column_or_a_default_is_more_than_a_scan(genuine, tmp_path):
    """Columns of the right names and types that compute their values (a server path, or gigabytes of text per
    row) are not what attnviz wrote: refused before a row is read."""
    path = tampered(genuine, tmp_path, "DROP TABLE documents",
                    "CREATE TABLE documents (doc INTEGER PRIMARY KEY, source VARCHAR, text VARCHAR GENERATED ALWAYS "
                    "AS (repeat('x', 200000000)), n_chars INTEGER, n_tokens INTEGER, truncated BOOLEAN, "
                    "problem VARCHAR)")
    with pytest.raises(database.NotAResultsFile, match="table main.documents's columns"):
        store.ScanReader(path)


def test_a_damaged_scan_is_missing_its_scan_and_its_message_shows_no_path(genuine, tmp_path):
    cut = tmp_path / "cut.duckdb"
    cut.write_bytes(genuine.read_bytes()[:8192])
    scrambled = tmp_path / "scrambled.duckdb"
    data = bytearray(genuine.read_bytes())
    data[20_000:20_100] = bytes(100)
    scrambled.write_bytes(bytes(data))
    for path in (cut, scrambled):
        try:
            with store.ScanReader(path) as reader:
                reader.statistic_map("previous")
        except database.NotAResultsFile as problem:
            assert problem.missing and str(tmp_path) not in str(problem)
        except RuntimeError as problem:  # read past the damage: said in words, without the path
            assert str(tmp_path) not in str(problem)
        else:
            pass  # the damage missed every block the page reads: nothing to say
    with pytest.raises(database.NotAResultsFile) as refused:
        store.ScanReader(cut)
    assert refused.value.missing


def test_a_projection_file_is_named_by_a_hash_never_by_what_a_scan_says(tmp_path):
    from attnviz.corpus.background import ScanFolder

    folder = ScanFolder(tmp_path / "scans")
    for key in ("/tmp/pwned", "../../../../etc/x", "k" * 24):
        path = folder.projections(tmp_path / "server" / "scan.duckdb", key)
        assert path.parent == folder.folder / "projections" and len(path.stem) == 32
    assert folder.projections(tmp_path / "a.duckdb", "k") != folder.projections(tmp_path / "b.duckdb", "k")
