"""Everything attnviz checks in a model folder before transformers may read a byte of it.

transformers trusts the folder it is given: it joins every name of ``model.safetensors.index.json`` onto it (an
absolute name or ``../`` leaves it), takes its pickle branch (``torch.load``) when the first shard name is not
``.safetensors``, opens whatever a tokenizer file turns out to be (a FIFO hangs, a link to ``/dev/zero`` reads
forever) and builds a model of whatever size a config describes. So, for every model attnviz loads:

1. :func:`inspect` resolves each file transformers will open to a regular file inside the folder, with a size
   bound checked before it is read: the weights (``model.safetensors``, or the shards an index names, each a plain
   ``.safetensors`` name whose header is read and checked here), ``config.json`` (its numbers checked, below), the
   tokenizer files, ``generation_config.json`` and the image processor's config. A link is followed only where
   :class:`LinkRule` allows (never in an upload); a name that would leave the folder is refused before anything is
   looked up, with words that never say whether a path outside exists.
2. The config's sizes (layers, heads, widths, vocabulary, positions, experts, in every nested sub-config) must be
   positive whole numbers within fixed bounds and bounds derived from the weights' real size, checked on the JSON
   before any model is built: a refusal takes milliseconds and never waits for :data:`loading.LOADING`.
3. transformers then reads a *view* (:func:`make_view`): a private folder of links to the checked files only, so
   that nothing else in the folder (a ``pytorch_model.bin``, a 90 MB README, another index) can be reached.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.checkpoints.checked_files import (  # noqa: F401 - the names other modules and the tests use from here
    CONFIG,
    SINGLE_WEIGHTS,
    WEIGHTS_INDEX,
    CheckedFile,
    LinkRule,
    MiB,
    plain_name_problem,
    read_json,
    regular_file,
    shown,
)
from attnviz.checkpoints.config_numbers import check_config, check_config_numbers
from attnviz.checkpoints.disk import WORKSPACE_PREFIX, uploads_root
from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.checkpoints.tokenizer_files import (  # noqa: F401
    MAX_VOCABULARY_ENTRIES,
    TIKTOKEN_LIMIT,
    TOKENIZER_LIMITS,
    check_tokenizer,
)
from attnviz.checkpoints.weight_files import INDEX_LIMIT, check_index, parameters_of, resolve_weights  # noqa: F401

# Files read as JSON before or while a model is built: larger than this, the checkpoint is refused.
CONFIG_LIMITS = {CONFIG: 1 * MiB, WEIGHTS_INDEX: INDEX_LIMIT, "generation_config.json": 1 * MiB}
# Optional files: too large, unreadable or not a plain file, and they are left out (the page says so).
IMAGE_PROCESSOR_FILES = {"preprocessor_config.json": 1 * MiB}


@dataclass
class CheckedFolder:
    """A model folder whose files have passed :func:`inspect`: only these are shown to transformers."""

    folder: Path
    config: dict  # config.json as JSON
    weights: list[CheckedFile]  # model.safetensors, or the shards
    index: CheckedFile | None  # model.safetensors.index.json, for shards
    tensors: int  # tensors in the weights' headers
    parameters: int  # numbers in the weights' headers
    others: list[CheckedFile] = field(default_factory=list)  # generation_config.json, the image processor's config
    tokenizer: list[CheckedFile] = field(default_factory=list)  # empty: no tokenizer (see tokenizer_problem)
    tokenizer_problem: str | None = None  # why the folder's tokenizer is not read, for the page
    notes: list[str] = field(default_factory=list)  # files left out, for the page

    @property
    def files(self) -> list[CheckedFile]:
        return [*self.weights, *([self.index] if self.index else []), *self.others, *self.tokenizer]

    def has(self, name: str) -> bool:
        return any(checked.name == name for checked in self.files)


def check_optional(folder: Path, links: LinkRule, name: str, limit: int) -> tuple[CheckedFile | None, str | None]:
    """An optional JSON file (generation or image-processor config): ``(checked file, None)``, ``(None, None)``
    when absent, or ``(None, why it is left out)``."""
    try:
        checked = regular_file(folder, name, links)
        if checked is not None:
            content = read_json(checked, limit)
            if not isinstance(content, dict):
                raise CheckpointRefused(f"{name} must hold a JSON object")
    except CheckpointRefused as problem:
        return None, f"{problem}; it was left out"
    return checked, None


# ---------------------------------------------------------------------------------------------------------------
# The whole folder


def inspect(folder: str | Path, links: LinkRule) -> CheckedFolder:
    """Check everything transformers will read in ``folder`` (see the module's docstring), following links only
    as ``links`` allows (:func:`attnviz.checkpoints.uploads.link_rule_for`); raises :class:`CheckpointRefused` with
    the reason. Reads only headers, JSON and sizes: milliseconds."""
    # Absolute (links not resolved): the view's links to the checked files must not depend on the working folder
    folder = Path(os.path.abspath(folder))
    config_file = regular_file(folder, CONFIG, links)
    if config_file is None:
        raise CheckpointRefused("no config.json found: a Hugging Face model folder needs one")
    config = check_config(read_json(config_file, CONFIG_LIMITS[CONFIG]))
    weights, index, headers = resolve_weights(folder, links)
    parameters = parameters_of(headers)
    tensors = sum(len(header) for header in headers)
    check_config_numbers(config, tensors, parameters)
    checked = CheckedFolder(folder, config, weights, index, tensors, parameters)
    checked.others.append(CheckedFile(CONFIG, config_file.real, config_file.size))
    for name, limit in (("generation_config.json", CONFIG_LIMITS["generation_config.json"]),
                        *IMAGE_PROCESSOR_FILES.items()):
        optional, note = check_optional(folder, links, name, limit)
        if optional is not None:
            checked.others.append(optional)
        elif note:
            checked.notes.append(note + ".")
    checked.tokenizer, checked.tokenizer_problem, notes = check_tokenizer(folder, links)
    checked.notes += notes
    return checked


def make_view(checked: CheckedFolder) -> Path:
    """A private folder holding links to the checked files only, for transformers to read (it cannot reach
    anything else of the model's folder). Give it to :func:`keep_view_while` once a model is built from it, or
    :func:`remove_view` it."""
    try:
        place = uploads_root()
    except CheckpointRefused:
        place = None  # the system's temporary folder: the name still marks it as an upload's, never opened by path
    view = Path(tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}view-", dir=place))
    for checked_file in checked.files:
        if checked_file.replacement is not None:
            (view / checked_file.name).write_bytes(checked_file.replacement)
        else:
            os.symlink(checked_file.real, view / checked_file.name)
    return view


def keep_view_while(view: Path, owner: object) -> None:
    """Remove ``view`` when ``owner`` (the model built from it) is collected, and at the latest at exit."""
    weakref.finalize(owner, shutil.rmtree, view, ignore_errors=True)


def remove_view(view: Path) -> None:
    shutil.rmtree(view, ignore_errors=True)
