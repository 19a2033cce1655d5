"""The bundled tiny GPT's words: a byte-level BPE that keeps everyday English and the app's own words whole, and
whole-word embeddings that start from the bundled BERT's, so that the model knows a kitten is like a cat although
its training text (Python's documentation) never says so. :mod:`attnviz.tiny_gpt.train` uses both."""

from __future__ import annotations

import torch

EOS = "<|endoftext|>"
WHOLE_WORD_REPEATS = 3000  # about as often as a top-100 English word in 3 million words
RARE_WORD_COUNT = 50  # a whole-word token seen fewer times in the training text keeps BERT's direction


def _word_text(word: str, repeats: int, capitalised: int) -> str:
    """Text for the BPE to count: `` word`` ``repeats`` times and `` Word`` ``capitalised`` times."""
    return f" {word}" * repeats + f" {word.capitalize()}" * capitalised


def train_tokenizer(text: str, vocab_size: int, common_words: int = 0, whole_words: tuple[str, ...] = ()):
    """A byte-level BPE (GPT-2's kind: any text encodes, no unknown tokens) trained on ``text`` and, with
    ``common_words``, on that many of the most frequent English words; each of ``whole_words`` is counted as often
    as a very frequent word (it becomes one token, `` word`` and `` Word``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    forced = [_word_text(word, WHOLE_WORD_REPEATS, WHOLE_WORD_REPEATS) for word in whole_words]
    tokenizer.train_from_iterator([text, *common_english_words(common_words), *forced], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS)


def common_english_words(count: int, words_of_text: int = 3_000_000) -> list[str]:
    """The ``count`` most frequent English words of ``wordfreq`` (alphabetic ones), each as `` word`` repeated
    as often as it would occur in ``words_of_text`` words of English (at least once), and `` Word`` a quarter as
    often: text for the BPE to count, so that a common word's pieces merge into one token."""
    if not count:
        return []
    try:
        import wordfreq
    except ImportError as error:  # a training-only extra (requirements-dev.txt)
        raise SystemExit("common words need the wordfreq package: pip install wordfreq") from error
    texts = []
    for word in wordfreq.top_n_list("en", count):
        if word.isalpha():
            repeats = max(1, int(words_of_text * wordfreq.word_frequency(word, "en")))
            texts.append(_word_text(word, repeats, max(1, repeats // 4)))
    return texts


@torch.no_grad()
def start_from_bert(embedding: torch.Tensor, vocab: dict[str, int], bert_table: torch.Tensor,
                    bert_vocab: dict[str, int], dims: int) -> list[int]:
    """Start the first ``dims`` dimensions of each whole-word row of ``embedding`` (``[vocab, d_model]``, changed
    in place; `` cat``: a byte-level token of ``vocab`` with a leading space, alphabetic, a single token of
    ``bert_vocab``) as BERT's embedding of the word (``bert_table`` ``[bert vocab, d_bert]``), projected on the
    top ``dims`` principal components of that whole table and scaled to the rows' own start there (the same mean
    length); the other dimensions keep their start. Wholly BERT's, the rows of related words were too alike to copy
    apart (greedy decoding of a sentence typed twice wrote "boys" for "him" and "boole" for "baker": 13 of 24
    fourth words, against 22). Returns the ids of the rows so started."""
    table = bert_table.detach().float()
    centred = table - table.mean(0)
    _, _, directions = torch.linalg.svd(centred, full_matrices=False)  # [d_bert, d_bert]: rows are the components
    projected = centred @ directions[:dims].T  # [bert vocab, dims]
    ours, theirs = [], []
    for token, index in vocab.items():
        word = token[1:].lower() if token.startswith("Ġ") else ""  # Ġ: the byte-level mark of a leading space
        if word.isascii() and word.isalpha() and word in bert_vocab:
            ours.append(index)
            theirs.append(bert_vocab[word])
    if ours:
        chosen = projected[theirs]
        scale = embedding[:, :dims].norm(dim=-1).mean() / chosen.norm(dim=-1).mean()
        embedding[ours, :dims] = chosen * scale
    return ours


class KeptDirections:
    """The BERT part (:func:`start_from_bert`) of the rows of whole words the training text barely uses
    (`` kitten``, `` rug``), kept. Adam moves every row by about the learning rate whatever its gradient, so in a
    few hundred steps such rows lost BERT's structure to the copying rows' noise; after each step their first
    ``dims`` dimensions are set back to their start, at the mean length that the rows that train have there. The
    other dimensions train: they are what tells two similar words apart when the model copies one."""

    def __init__(self, embedding: torch.Tensor, rows: list[int], dims: int):
        self.embedding, self.rows, self.dims = embedding, torch.tensor(rows, dtype=torch.long), dims
        start = embedding.detach()[self.rows, :dims]  # [rows, dims]
        self.directions = start / start.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        self.trained = torch.ones(len(embedding), dtype=torch.bool)
        self.trained[self.rows] = False

    @torch.no_grad()
    def restore(self) -> None:
        length = self.embedding[self.trained, : self.dims].norm(dim=-1).mean()
        self.embedding[self.rows, : self.dims] = self.directions * length


def rare_word_rows(tokenizer, ids: torch.Tensor, transplanted: list[int]) -> list[int]:
    """Of the ``transplanted`` token ids, those the training text (``ids``) holds fewer than RARE_WORD_COUNT times."""
    counts = torch.bincount(ids, minlength=len(tokenizer))
    return [row for row in transplanted if counts[row] < RARE_WORD_COUNT]
