"""The bundled tiny GPT's model card: the recipe in words and what ``python -m attnviz.tiny_gpt.train`` measured on the
saved folder (circuits, generalisation, losses), so every figure on the card comes from the run that wrote it."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace


def model_card(recipe, report: dict, *, long_batch: int, copied_positions: bool, eos: str,
               rare_count: int = 50) -> str:
    """The bundled GPT's README.md: ``recipe`` (a :class:`attnviz.tiny_gpt.train.Recipe`) in words, and every figure
    the training script measured (``report``). ``long_batch``: the rows of a whole-context batch;
    ``copied_positions``: whether the long phase started untrained positions as copies of trained ones; ``eos``: the
    tokenizer's end-of-text token; ``rare_count``: below this many uses in the text, a whole word's embedding kept
    BERT's direction."""
    best_prev, best_ind, best_random = _best_heads(report)
    words = _recipe_phrases(recipe, report, long_batch=long_batch, copied_positions=copied_positions,
                            rare_count=rare_count)
    kind, heads, pool_text, text_rows, positions = words.kind, words.heads, words.pool_text, words.text_rows, \
        words.positions
    halves, common_words, app_words, word_embeddings = words.halves, words.common_words, words.app_words, \
        words.word_embeddings
    repeats, sentences, transplanted = report["random_repeats"], report["sentences_twice"], words.transplanted
    return f"""# attnviz tiny GPT

A {recipe.n_layer}-layer {kind} ({heads}, d_model {recipe.n_embd}, {recipe.context} positions,
{report['parameters']:,} parameters), trained by `python -m attnviz.tiny_gpt.train` so that attnviz can show a real
decoder generating text, offline. It is a teaching model: it writes Python-documentation-flavoured English, often
wrongly, and it has memorised much of its training text.

- **Data**: Python's documentation topics (`pydoc_data.topics`, shipped with Python {report['python']}){
    " and the standard library's docstrings" if recipe.docstrings else ""},
  {report['train_tokens']:,} tokens for training and {report['held_out_tokens']:,} held out (the last
  {recipe.held_out_share:.0%}); {recipe.repeat_share:.0%} of each batch is sequences repeated (periods
  {recipe.repeat_periods[0]}–{recipe.repeat_periods[1] - 1}, at most half the sequence), which teaches induction:
  {text_rows}random tokens {pool_text}.
- **Tokenizer**: byte-level BPE, {recipe.vocab_size:,} tokens, trained on the same
  text{common_words}{app_words}; `{eos}` is BOS and EOS.{word_embeddings}
- **Training**: {recipe.steps} steps of {recipe.batch} x {recipe.train_length} tokens{positions}, AdamW (lr
  {recipe.learning_rate}, warm-up {recipe.warmup}, cosine to a tenth, weight decay {recipe.weight_decay}), seed
  {recipe.seed}{_fused(recipe)}, CPU ({report['threads']} thread{'s' if report['threads'] != 1 else ''}):
  {report['seconds'] / 60:.1f} minutes with torch {report['torch']}.
- **Final loss**: training {report['final_train_loss']:.3f} nats/token (documentation batches), held-out
  {report['held_out_loss']:.3f} nats/token (32 windows of {recipe.train_length} tokens){halves}.
- **Circuits** (eager attention weights of the saved model):
  - previous-token head: layer {best_prev[1]}, head {best_prev[2]}, mean weight on position i-1 =
    {best_prev[0]:.3f} on held-out text;
  - induction head: layer {best_ind[1]}, head {best_ind[2]}, mean weight from each second-half token to the
    token after its first occurrence = {best_ind[0]:.3f} on {report['circuits']['period']} random tokens
    repeated twice.{_over_training(report)}
- **On inputs it never saw** (`attnviz.core.circuits`, the same measures as the tests, which repeat them on fresh
  seeds):
  - random tokens drawn from the whole vocabulary (special tokens left out) repeated twice, lengths
    {', '.join(map(str, repeats['lengths']))} ({repeats['seeds']} sequences each): best induction head layer
    {best_random[1]}, head {best_random[2]}, **{best_random[0]:.3f}** on the target; next-token loss
    {repeats['first_loss']:.2f} nats on the first copy and {repeats['second_loss']:.2f} on the second
    (**{repeats['ratio']:.2f}x**);
  - {sentences['sentences']} English sentences of our own (`attnviz.tiny_gpt.text.REPEAT_SENTENCES`), each typed
    twice: loss {sentences['first_loss']:.2f} on the first copy and {sentences['second_loss']:.2f} on the second
    (**{sentences['ratio']:.2f}x**); greedy decoding continues the repeat at {sentences['continued']:.1%} of the
    second copy's tokens (whole sentences: {sentences['sentences_continued']:.0%}).
- **Licence**: the training text is Python's documentation, copyright the Python Software Foundation, under the
  PSF License Agreement (https://docs.python.org/3/license.html); the weights, trained on that text, are
  distributed under the same terms.{" The tokenizer's merges were also counted on wordfreq's English word list "
  "(https://github.com/rspeer/wordfreq, data under CC BY-SA 4.0); no text of it is in the weights." if
  recipe.common_words else ""}{" The whole-word embeddings started from all-MiniLM-L6-v2's (Apache License 2.0)."
  if transplanted else ""}
"""


def _over_training(report: dict) -> str:
    """The card's lines on the run's own record (``over-training/``), empty for a run that kept none."""
    kept = report.get("over_training")
    if not kept:
        return ""
    return "\n" + textwrap.fill(_over_training_line(kept), width=116, subsequent_indent="  ", break_on_hyphens=False)


def _over_training_line(kept: dict) -> str:
    """The card's bullet on the run's record, on one line."""
    change, icl = kept["phase_change"], {int(step): value for step, value in kept["icl_by_step"].items()}
    lines = (f"- **Over training** (`over-training/measures.json`: every head's scores, the loss and the in-context "
             f"learning score at {kept['measured_steps']} log-spaced steps")
    if change is None:
        return lines + "): no phase change by the rule the Over training page states."
    before = change["before"] if change["before"] is not None else min(icl)
    return (lines + f"; float16 snapshots at steps {', '.join(map(str, kept['snapshots']))}): the induction head "
            f"layer {change['layer']}, head {change['head']} rose from {change['low']:.3f} to {change['high']:.3f}, "
            f"its phase change from step {change['start']} to {change['end']}; the in-context-learning score (loss "
            f"on tokens 96–127 minus tokens 8–23) went from {icl[before]:+.3f} at step {before} to "
            f"{icl[change['end']]:+.3f} at step {change['end']}.")


def _best_head(scores) -> tuple[float, int, int]:
    """(score, layer, head) of the highest score in a layers x heads list."""
    return max((value, layer, head) for layer, row in enumerate(scores) for head, value in enumerate(row))


def _best_heads(report: dict) -> tuple:
    """The best previous-token and induction heads on the training script's measures, and the best induction head
    on random tokens repeated twice."""
    circuits = report["circuits"]
    return (_best_head(circuits["previous_token"]), _best_head(circuits["induction"]),
            _best_head(report["random_repeats"]["induction"]))


def _fused(recipe) -> str:
    """The loss's words when the run fused it with the LM head (``--fused-loss``); none in the shipped recipe."""
    return (", the LM head and its loss fused a block of rows at a time (`attnviz.tiny_gpt.loss`)"
            if recipe.fused_loss else "")


def _recipe_phrases(recipe, report: dict, *, long_batch: int, copied_positions: bool, rare_count: int):
    """The card's phrases that depend on which parts of the recipe were used (each empty when unused)."""
    span = recipe.text_repeat_span
    pieces = f"windows of {span[0]}–{span[1] - 1} tokens from random places, joined" if span[1] else "one window"
    positions = "".join([
        f" ({recipe.shifted_share:.0%} of the rows at a random offset in the context)" if recipe.shifted_share else "",
        f", the last {recipe.long_steps} of them on {long_batch} x {recipe.context} tokens (the whole context"
        + (f"; positions {recipe.train_length}–{recipe.context - 1} starting as copies of 0–{recipe.train_length - 1},"
           " as Longformer extended RoBERTa's" if copied_positions else "")
        + ")" if recipe.long_steps else ""])
    halves = report.get("held_out_loss_by_half")
    halves = (f"; on whole {recipe.context}-token windows, {halves[0]:.3f} over the first half of the positions "
              f"and {halves[1]:.3f} over the second") if halves else ""
    if halves and not (recipe.shifted_share or recipe.long_steps or recipe.train_length >= recipe.context):
        halves += f" (positions from {recipe.train_length} on were never trained)"
    return SimpleNamespace(
        kind="GPT-2" if recipe.architecture == "gpt2" else "Llama",
        heads=f"{recipe.n_head} heads" + ("" if recipe.architecture == "gpt2" else f" sharing {recipe.n_kv_head} K/V"),
        pool_text=(f"drawn from the {recipe.repeat_pool} most frequent tokens" if recipe.repeat_pool
                   else "drawn from every ordinary token of the vocabulary"),
        text_rows=(f"{recipe.text_repeat_share:.0%} of them pieces of the documentation ({pieces}: English the model "
                   "cannot recite), the rest " if recipe.text_repeat_share else ""),
        positions=positions, halves=halves,
        common_words=(f" and on the {recipe.common_words:,} most frequent English words of the `wordfreq` package's "
                      "list (each as often as in 3 million words of English), so that everyday words are single "
                      "tokens; the model never trains on that list" if recipe.common_words else ""),
        app_words=("; the words of the app's own sentences (`attnviz.tiny_gpt.text.APP_SENTENCES`: the cat on the "
                   "mat, the kitten on the rug) were counted as often as very frequent words, so each is one token"
                   if getattr(recipe, "app_words", False) else ""),
        transplanted=report.get("bert_word_embeddings", 0),
        word_embeddings=_word_embeddings_phrase(recipe, report, rare_count),
    )


def _word_embeddings_phrase(recipe, report: dict, rare_count: int) -> str:
    """The card's paragraph on the whole-word embeddings that started as BERT's (empty when none did)."""
    transplanted = report.get("bert_word_embeddings", 0)
    dims = getattr(recipe, "bert_dims", recipe.n_embd)
    return (f"""
- **Word embeddings**: the first {dims} of the {recipe.n_embd} dimensions of the {transplanted:,} whole-word tokens (a
  leading space and a word the bundled BERT, all-MiniLM-L6-v2, has as one token) started as BERT's embedding of the
  word, projected on the top {dims} principal components of BERT's embedding table and scaled to GPT-2's starting
  length; their other dimensions and every other token started random. The {report.get("kept_word_directions", 0):,}
  of them that the training text holds fewer than {rare_count} times kept the direction of those {dims} dimensions
  throughout (set back after every step, at the mean length of the rows that train), while the rest trained:
  Python's documentation never mentions a kitten, so only BERT tells the model that kitten and cat are alike, as
  the cross-attention example on Heads and KV cache shows.""" if transplanted else "")
