"""Corpus runs from Python: :func:`scan` (what every head does across a corpus) and :func:`importance` (whether each
head matters across a corpus), on the same runners as ``python -m attnviz.corpus.scan`` / ``python -m
attnviz.corpus.importance`` and the pages (:func:`attnviz.corpus.scan.runner.run_scan`,
:func:`attnviz.corpus.importance.runner.run_importance`), so a notebook, the command line and the app write the same
DuckDB file. A run shows a progress bar (``tqdm.auto``: a widget in Jupyter, text in a terminal), stops when the
notebook's stop button is pressed (at the next chunk of documents, resumably: call it again with the same path to
go on) and returns its file as :class:`ScanRun` or :class:`ImportanceRun`, whose tables read as pandas DataFrames.
:func:`open_scan` and :func:`open_importance` reopen a file.

Definitions, beside TransformerLens's where they differ
-------------------------------------------------------

**Loss averaging** (:func:`importance`). The objective is the model's own loss (next-token loss for a decoder; an
encoder-decoder's and a masked-LM encoder's are in docs/importance.md; an encoder without a head has none, and the
change of its hidden states stands in). A document's loss is the mean of its own predicted tokens' cross-entropy
(nats; next-token loss: tokens 2..n, each predicted from those before it; padding never counts), and a map's value
is the mean over the documents of each document's change, every document counting once whatever its length
(``spread``: the sample standard deviation over the documents). TransformerLens's ``lm_cross_entropy_loss``
(``model(tokens, return_type="loss")``) pools every predicted token of the batch into one mean, so a long text
weighs more; ``loss_per_token=True`` gives the ``[batch, pos - 1]`` losses from which attnviz's number is each row's
mean over its real positions, then the mean of the rows. Both agree when every text has the same length.

**BOS**. attnviz reads a text as its tokenizer gives it (``tokenizer(text)``, the special tokens it adds itself
included, and counted in ``max_tokens``): GPT-2's and the bundled tiny GPT's tokenizers put no BOS first, BERT's
puts ``[CLS]`` first and ``[SEP]`` last. TransformerLens prepends the BOS token by default (``prepend_bos=True``,
``cfg.default_prepend_bos``), so on a GPT-2-style model its positions are one later, its heads have a BOS to rest
their weight on, and its loss predicts one token more (the first word, from the BOS). Compare with
``prepend_bos=False``, or put the BOS token into the documents given to attnviz.

**Where an ablation acts**. attnviz edits each head's output, its attention weights times its values
(``[batch, n_q, heads, d_v]``), just before the output projection mixes the heads
(:mod:`attnviz.interventions.edits`): the tensor TransformerLens calls ``hook_z`` (in TransformerLens 4 the
attention bridge's alias of the output projection's input, ``o.hook_in``, as ``[batch, pos, head_index,
d_head]``). Zero ablation here is ``hook_z[:, :, head] = 0``; mean ablation puts in the head's mean ``z`` over every
real token of the whole corpus (a first pass over the documents; padding left out), not a per-position or per-batch
mean; gradient importance is |dL/dg| for a gate g multiplying that head's ``z`` (Michel et al. 2019), per document,
then averaged over the documents. An edit of ``hook_pattern`` (the weights, before they multiply the values) is
another experiment: zeroing a head's pattern also zeroes its ``z``, but replacing the pattern by its mean is not
replacing ``z`` by its mean.

**Head detectors** (:meth:`ScanRun.detect`). The duplicate-token and induction targets are TransformerLens's
``detect_head`` patterns (an earlier occurrence of the query's token; the key right after one), and previous-token
its previous-token pattern (the key just before the query), but the score differs: a scan averages a head's weight on
the target over the queries that have one (a query whose token occurred before; every query but the first), pooled
over every query of every document (``over="documents"``: each document's mean, then the mean of the documents, as
``detect_head`` averages a list of texts). ``detect_head`` (its default ``error_measure="mul"``) divides the same
weight by every query of the text, so its scores are smaller by the share of queries without a target (the
``transformerlens_mul`` column: that division, pooled over the documents); it reads the text with a BOS first unless
told ``prepend_bos=False``, where the scan reads it as the tokenizer gives it and never counts a special token as a
repeat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import numbers
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from attnviz.api.run_control import ProgressBar, StopRequests, mark_stopped
from attnviz.api.run_files import ImportanceRun, ScanRun, _RunFile
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.corpus.command import chosen_model
from attnviz.corpus.document_files import TXT_SPLITS
from attnviz.corpus.documents import BUNDLED, Collector, Corpus, CorpusRefused
from attnviz.corpus.importance.runner import (
    SCAN_PREFIX,
    ImportanceSettings,
    importance_key,
    read_corpus_spec,
    run_importance,
)
from attnviz.corpus.importance.store import ImportanceReader, ImportanceWriter
from attnviz.corpus.options import SettingsRefused, checked_values
from attnviz.corpus.scan.runner import ScanRefused, ScanSettings, run_scan, scan_key
from attnviz.corpus.scan.store import STATUS_STOPPED, ScanReader, ScanWriter
from attnviz.models.loading import DTYPES, ModelBundle, load_model_dir
from attnviz.models.shipped import bundled_models

# The keyword arguments the run functions take themselves, named when a setting's name is unknown.
RUN_ARGUMENTS = ("path", "tokenizer", "progress", "ray", "workers", "split", "field", "dtype")
IN_MEMORY_RECORD = ".attnviz-model-{digest}"  # beside a run's file: what identifies an in-memory model (see below)


# -- running -----------------------------------------------------------------------------------------------------
def scan(corpus, model, path: str | Path | None = None, *, tokenizer=None, progress: bool = True,
         ray: str | None = None, workers: int = 2, split: str = "line", field: str | None = None,
         dtype: str = "stored", **settings) -> ScanRun:
    """Scan ``model`` over ``corpus`` into the DuckDB file at ``path``, as ``python -m attnviz.corpus.scan`` and the
    page "Heads across a corpus" do, and return it as a :class:`ScanRun`.

    ``corpus``: the documents as a list of strings, a corpus file (``.txt``, one document per line or, with
    ``split="paragraph"``, per paragraph; ``.jsonl``, ``.csv`` or ``.parquet``, the ``field`` column, ``text`` by
    default), ``"bundled"`` (Python's documentation and docstrings), ``"scan:FILE"`` or a :class:`ScanRun` (the
    documents another scan read), or a :class:`~attnviz.corpus.documents.Corpus`. ``model``: a bundled model's name
    (or its start: ``"tiny GPT"``), a checkpoint folder, a :class:`~attnviz.models.loading.ModelBundle` (loaded once
    for several runs), or a loaded transformers model with its ``tokenizer=`` (kept in memory: it cannot go to Ray;
    its weights' digest identifies it, in a small folder beside the file). ``dtype``: "stored" or "fp32", for a name
    or a folder.

    ``settings``: the fields of :class:`~attnviz.corpus.scan.runner.ScanSettings`: ``max_docs`` (1,000),
    ``max_tokens`` (128, special tokens included), ``chunk_docs`` (64: what a stop may lose), ``qk_points`` (the
    Queries and keys page's sample; 0 for none); another name or a value of the wrong type is refused with the valid
    names. ``path``: default ``scan-<model>-<corpus>-<key>.duckdb`` in the current folder, ``key`` naming the corpus,
    model and limits, so the same call finds its own file again.

    ``progress``: a bar over the documents. ``ray``: ``"auto"`` (a local cluster, started if none runs) or a
    cluster's address, with ``workers`` replicas of the model. Interrupting (the notebook's stop button, Ctrl-C)
    stops at the next chunk and returns the run, "stopped"; a second interrupt stops at once, keeping every committed
    chunk. The same call again resumes it; a finished scan is returned as it is. A file that holds another scan (other
    documents, model or limits) is refused, naming what differs."""
    chosen = _settings_of(ScanSettings, settings, "scan")
    _check_reading(split, dtype, ray, workers)
    stops = StopRequests()
    with stops.listening():
        documents, corpus_name = _corpus_of(corpus, split, field, chosen.max_docs)
        if ray and _in_memory(model):
            raise ScanRefused(_NOT_ON_RAY)
        bundle = _scan_bundle(model, tokenizer, dtype, _folder_of(path))
        key = scan_key(documents, bundle.folder, chosen, bundle.dtype)
        path = Path(path) if path is not None else _default_path("scan", bundle.name, corpus_name, key)
        done = _check_same_run(path, key, ScanReader, "scan", {
            "corpus_fingerprint": documents.fingerprint, "model_folder": str(bundle.folder),
            "max_docs": chosen.max_docs, "max_tokens": chosen.max_tokens, "qk_points": chosen.qk_points})
        measure = _measure_on_ray(ray, workers, "scan")
        with ProgressBar(progress, min(chosen.max_docs, documents.count), done) as bar:
            try:
                run_scan(documents, bundle, path, chosen, progress=stops.guarded(bar.show), should_stop=stops,
                         measure=measure, dtype=_load_dtype(model, bundle, dtype))
            except KeyboardInterrupt:  # interrupted again, mid-chunk: the chunk in flight was never committed
                mark_stopped(ScanWriter, path)
    return _returned(ScanRun(path), "scan")


def importance(corpus, model, path: str | Path | None = None, *, tokenizer=None, progress: bool = True,
               ray: str | None = None, workers: int = 2, split: str = "line", field: str | None = None,
               dtype: str = "stored", **settings) -> ImportanceRun:
    """Measure whether each head of ``model`` matters over ``corpus`` into the DuckDB file at ``path``, as
    ``python -m attnviz.corpus.importance`` and the page "Does this head matter?" do, and return it as an
    :class:`ImportanceRun`: each document's change of the model's own loss when each head is zeroed or replaced by
    its corpus mean, and its gradient importance (see the module's notes for the definitions beside
    TransformerLens's).

    ``corpus``, ``model``, ``path``, ``progress``, ``ray``, ``workers``, ``split``, ``field``, ``dtype``,
    interrupting and resuming: as :func:`scan` (default file ``importance-<model>-<corpus>-<key>.duckdb``). A model
    given by name or folder is loaded with its language-model head; a loaded model is measured as it is (with
    its LM head if it has one, else the change of its hidden states), its attention switched to attnviz's function
    for the run and switched back after it.

    ``settings``: the fields of :class:`~attnviz.corpus.importance.runner.ImportanceSettings`: ``max_docs`` (200),
    ``max_tokens`` (64), ``chunk_docs`` (16), ``methods`` (("zero", "mean", "gradient"); a list, or one name);
    another name or a value of the wrong type is refused with the valid names."""
    if isinstance(settings.get("methods"), str):  # one measure, or the command line's "zero,mean"
        settings["methods"] = tuple(part.strip() for part in settings["methods"].split(",") if part.strip())
    chosen = _settings_of(ImportanceSettings, settings, "importance")
    _check_reading(split, dtype, ray, workers)
    stops = StopRequests()
    with stops.listening():
        documents, corpus_name = _corpus_of(corpus, split, field, chosen.max_docs)
        source = _source_of(corpus)
        if ray and _in_memory(model):
            raise ScanRefused(_NOT_ON_RAY)
        folder, name, loaded, dtype = _importance_model(model, tokenizer, dtype, _folder_of(path))
        key = importance_key(documents, folder, chosen, dtype)
        path = Path(path) if path is not None else _default_path("importance", name, corpus_name, key)
        done = _check_same_run(path, key, ImportanceReader, "importance run", {
            "corpus_fingerprint": documents.fingerprint, "model_folder": str(folder), "max_docs": chosen.max_docs,
            "max_tokens": chosen.max_tokens})
        measure = _measure_on_ray(ray, workers, "run")
        with ProgressBar(progress, min(chosen.max_docs, documents.count), done) as bar, \
                _edits_reach(loaded[0] if loaded else None):
            try:
                run_importance(documents, folder, path, chosen, name=name, dtype=dtype, loaded=loaded, source=source,
                               progress=stops.guarded(bar.show), should_stop=stops, measure=measure)
            except KeyboardInterrupt:
                mark_stopped(ImportanceWriter, path)
    return _returned(ImportanceRun(path), "importance")


# -- settings, corpus, model -------------------------------------------------------------------------------------
def _settings_of(cls: type, given: Mapping[str, Any], function: str):
    """The settings dataclass ``cls`` built from a run function's keyword arguments, checked by name and type as a
    settings file is (:func:`attnviz.corpus.options.checked_values`); NumPy's integers count as integers."""
    values = {name: int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value
              for name, value in given.items()}
    try:
        checked = checked_values((cls,), values, f"{function}(**settings)")
    except SettingsRefused as problem:
        unknown = set(values) - {field.name for field in dataclasses.fields(cls)}
        raise SettingsRefused(f"{problem}" + (f"; {function}() itself also takes {', '.join(RUN_ARGUMENTS)}"
                                               if unknown else "")) from None
    return cls(**checked)


def _check_reading(split: str, dtype: str, ray, workers) -> None:
    if split not in TXT_SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, TXT_SPLITS))}, not {split!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, not {dtype!r}")
    if ray is not None and not isinstance(ray, str):
        raise TypeError(f"ray must be 'auto' or a cluster's address, not {ray!r}")
    if not isinstance(workers, numbers.Integral) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a whole number of model replicas, at least 1, not {workers!r}")


def _corpus_of(corpus, split: str, field: str | None, keep: int) -> tuple[Corpus, str]:
    """The run's corpus and a short name for its default file. A list of strings goes through the same reader
    rules as a file's lines (an empty document is counted and left out, said as a warning)."""
    if isinstance(corpus, Corpus):
        return corpus, corpus.name
    if isinstance(corpus, ScanRun):
        corpus = f"{SCAN_PREFIX}{corpus.path}"
    if isinstance(corpus, (str, Path)):
        spec = str(corpus)
        bare = spec.removeprefix(SCAN_PREFIX)
        if spec != BUNDLED and not Path(bare).is_file():
            raise CorpusRefused(f"no corpus file at {bare[:80]!r}: give 'bundled', a .txt, .jsonl, .csv or .parquet "
                                "file, 'scan:FILE.duckdb', or the documents as a list of strings")
        read = read_corpus_spec(spec, split=split, field_name=field, keep=keep)
        stem = Path(bare).stem
        name = "bundled" if spec == BUNDLED else stem if spec == bare or stem.startswith("scan-") else f"scan-{stem}"
    elif isinstance(corpus, (list, tuple)):
        collector = Collector()
        for index, text in enumerate(corpus):
            if not isinstance(text, str):
                raise TypeError(f"document {index} is {type(text).__name__}, not a string")
            collector.offer(text, f"document {index}")
        read, name = collector.corpus(f"a list of {len(corpus):,} documents"), "documents"
    else:
        raise TypeError(f"corpus must be a list of strings, a corpus file's path, 'bundled', 'scan:FILE' or a "
                        f"ScanRun, not {type(corpus).__name__}")
    for line in read.report.lines():
        warnings.warn(line, stacklevel=3)
    if not read.documents:
        raise CorpusRefused("the corpus holds no document to read")
    return read, name


def _source_of(corpus) -> str | None:
    """The corpus as the command line names it, kept with an importance run (a scan's documents link it to the
    scan's labels on the page); None for documents given as a list."""
    if isinstance(corpus, ScanRun):
        return f"{SCAN_PREFIX}{corpus.path}"
    return str(corpus) if isinstance(corpus, (str, Path)) else None


def _in_memory(model) -> bool:
    return isinstance(model, torch.nn.Module) or (isinstance(model, ModelBundle) and not _checkpoint(model.folder))


def _checkpoint(folder) -> bool:
    """Whether ``folder`` holds a checkpoint a replica can load (what a Ray worker, or the LM loader, reads)."""
    return folder is not None and (Path(folder) / "config.json").is_file() and any(Path(folder).glob("*.safetensors"))


_NOT_ON_RAY = ("a model in memory cannot go to Ray: each worker loads its own replica from a folder. Save it "
               "(model.save_pretrained(folder); tokenizer.save_pretrained(folder)) and pass the folder, or run "
               "without ray=")


def _folder_named(model) -> tuple[Path, str]:
    """(folder, name) of a bundled model's name (or its start) or a checkpoint folder."""
    try:
        folder, bundled_name = chosen_model(str(model), bundled_models())
    except CheckpointRefused:
        raise CheckpointRefused(f"model={str(model)!r} is not a folder here, nor a bundled model's name; the bundled "
                                f"models are {', '.join(map(repr, bundled_models()))}") from None
    return folder, bundled_name or folder.name


def _scan_bundle(model, tokenizer, dtype: str, beside: Path) -> ModelBundle:
    """The model a scan captures: loaded from a name or folder, given as a bundle, or a loaded transformers model
    made one by :func:`attnviz.api.capture.bundle_of` (its ``folder`` then a record of its weights' digest)."""
    if isinstance(model, ModelBundle):  # a bundle of a model in memory (bundle_of's) names a folder that is nowhere
        return model if _checkpoint(model.folder) else dataclasses.replace(
            model, folder=_in_memory_record(model.model, beside))
    if isinstance(model, (str, Path)):
        folder, name = _folder_named(model)
        return load_model_dir(folder, name=name, dtype=dtype)
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise TypeError("a loaded model needs its tokenizer: scan(corpus, model, tokenizer=tokenizer)")
        from attnviz.api.capture import bundle_of  # the capture API's own loaded-model adapter (same layer)

        bundle = bundle_of(model, tokenizer)
        return dataclasses.replace(bundle, folder=_in_memory_record(model, beside))
    raise TypeError(f"model must be a bundled model's name, a checkpoint folder, a ModelBundle or a loaded "
                    f"transformers model, not {type(model).__name__}")


def _importance_model(model, tokenizer, dtype: str, beside: Path) -> tuple[Path, str, tuple | None, str]:
    """(folder, name, loaded (model, tokenizer) or None, dtype) for :func:`run_importance`: a name or a folder is
    loaded there with its LM head; a bundle loaded from a checkpoint is loaded again with its LM head (a bundle
    holds the model without it); a model in memory is measured as it is."""
    if isinstance(model, (str, Path)):
        folder, name = _folder_named(model)
        return folder, name, None, dtype
    if isinstance(model, ModelBundle):
        if _checkpoint(model.folder):
            return Path(model.folder), model.name, None, _load_dtype(model, model, dtype)
        model, tokenizer = model.model, model.tokenizer
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise TypeError("a loaded model needs its tokenizer: importance(corpus, model, tokenizer=tokenizer)")
        return _in_memory_record(model, beside), _model_name(model), (model, tokenizer), "stored"
    raise TypeError(f"model must be a bundled model's name, a checkpoint folder, a ModelBundle or a loaded "
                    f"transformers model, not {type(model).__name__}")


def _load_dtype(model, bundle: ModelBundle, asked: str) -> str:
    """How the checkpoint is loaded again as the run's model (by a Ray replica; by the importance run, with its LM
    head), as a name of :data:`~attnviz.models.loading.DTYPES`: as asked for a name or a folder; for a bundle,
    "stored" when it holds the dtype its checkpoint stores (so that it names the same run as the name or folder
    would), else "fp32", the one other way attnviz loads."""
    if isinstance(model, (str, Path)):
        return asked
    try:
        config = json.loads((Path(bundle.folder) / "config.json").read_text())
        stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    except (OSError, ValueError, AttributeError):  # unreadable, or not a JSON object: transformers' own default
        stored = "float32"
    return "stored" if bundle.dtype == stored else "fp32"


def _model_name(model: torch.nn.Module) -> str:
    named = str(getattr(getattr(model, "config", None), "name_or_path", "") or "")
    return Path(named).name or type(model).__name__


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's config and every parameter and buffer (name, shape, dtype and bytes): what identifies a
    model that lives in memory only, so that a run resumes only with the same weights. One tensor at a time is
    copied to the CPU (seconds per GB)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(_config_of(model), sort_keys=True).encode())
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        if tensor.device.type != "meta":  # an offloaded tensor has no data here: its name and shape stand for it
            digest.update(tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy())
    return digest.hexdigest()


def _in_memory_record(model: torch.nn.Module, beside: Path) -> Path:
    """A folder beside the run's file that stands for a model in memory where a run names its model by folder:
    its ``config.json`` starts with the weights' digest (the runs' key reads a folder's config.json and safetensors
    files), then the model's config. The run's ``model_folder`` setting names it."""
    digest = weights_digest(model)
    record = beside / IN_MEMORY_RECORD.format(digest=digest[:16])
    record.mkdir(parents=True, exist_ok=True)
    # a function of the digest's inputs alone: the same weights always give the same file, and so the same key
    described = {"in_memory_weights_sha256": digest, "config": _config_of(model)}
    (record / "config.json").write_text(json.dumps(described, indent=1, sort_keys=True))
    return record


def _config_of(model: torch.nn.Module) -> dict:
    """A model's config as JSON, without what does not change what it computes: where it was loaded from
    (``_name_or_path``) and the transformers version that wrote it."""
    config = getattr(model, "config", None)
    if config is None:
        return {"class": type(model).__name__}
    return {key: value for key, value in json.loads(config.to_json_string(use_diff=False)).items()
            if not key.startswith("_") and key != "transformers_version"}


@contextlib.contextmanager
def _edits_reach(model: torch.nn.Module | None) -> Iterator[None]:
    """For a model in memory: for the block, in eval mode (dropout would make every measure noise) with its attention
    switched to attnviz's function (where edits act), both set back after it; refused when attnviz cannot edit its
    heads. Nothing for a model the run loads itself."""
    if model is None:
        yield
        return
    from attnviz.interventions.edits import editable
    from attnviz.models.architectures import uses_attention_interface
    from attnviz.models.attention_hook import ATTENTION_NAME

    training = model.training
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switched = uses_attention_interface(model) and before != ATTENTION_NAME
    model.eval()
    if switched:
        model.set_attn_implementation(ATTENTION_NAME)
    try:
        reason = editable(model)
        if reason is not None:
            raise CheckpointRefused(f"its heads cannot be removed here: {reason}")
        yield
    finally:
        if switched:
            model.set_attn_implementation(before)
        model.train(training)


def _folder_of(path: str | Path | None) -> Path:
    return Path(path).parent if path is not None else Path.cwd()


def _slug(text: str, most: int = 32) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:most].strip("-") or "run"


def _default_path(kind: str, model_name: str, corpus_name: str, key: str) -> Path:
    """``<kind>-<model>-<corpus>-<key>.duckdb`` in the current folder: a bundled model by its short name ("tiny GPT
    (bundled, ...)" is ``tiny-gpt``), the key's first 8 characters naming the documents, model and limits."""
    model_slug = _slug(Path(model_name.split(" (")[0]).name or model_name)  # a folder or hub path: its last part
    return Path.cwd() / f"{kind}-{model_slug}-{_slug(corpus_name)}-{key[:8]}.duckdb"


def _check_same_run(path: Path, key: str, reader: type, what: str, wanted: dict[str, Any]) -> int:
    """Documents already in the file at ``path`` (0 if there is none). Refused when it is not a run's file of this
    kind (the runner would add its tables to any DuckDB file), or holds another run: which of ``wanted`` differ."""
    if not path.exists():
        return 0
    try:
        with reader(path) as opened:
            said, done = dict(opened.settings), opened.documents
    except Exception as problem:  # noqa: BLE001 - NotAResultsFile, DatabaseBusy, a DuckDB error: said in words
        raise ScanRefused(f"{path.name} cannot be resumed as a {what}: {problem}. Pass another path=") from None
    if not said or said.get("key") == key:
        return done
    differ = [f"{name} {said.get(name)!r} there, {value!r} here" for name, value in wanted.items()
              if said.get(name) != value and name != "corpus_fingerprint"]
    if said.get("corpus_fingerprint") != wanted.get("corpus_fingerprint"):
        differ.insert(0, f"other documents ({said.get('corpus')!r} there)")
    raise ScanRefused(f"{path.name} holds another {what}: {'; '.join(differ) or 'another model (its weights or dtype)'}"
                      f". Pass another path=, or delete the file to start again")


def _measure_on_ray(ray: str | None, workers: int, verb: str):
    if not ray:
        return None
    from attnviz.corpus.on_ray import on_ray

    return on_ray(ray, int(workers), 1, what=verb)


def _returned(run: _RunFile, function: str):
    """The run, after a line saying how to go on when it stopped."""
    if run.status == STATUS_STOPPED:
        print(f"Stopped: {run.done:,} of {run.planned:,} documents are in {run.path}. Call {function}(...) again with "
              f"the same arguments (path={str(run.path)!r}) to go on from there.", flush=True)
    return run
