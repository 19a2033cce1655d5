"""The Generation page's figures, each with the caption that says what to notice: a step's next-token distribution
and attention, the timeline of every step, the attention sink, the whole sequence, an encoder-decoder's
cross-attention, and the PagedAttention and Ring attention simulations, each as ``(figure, caption)``."""

from __future__ import annotations

from attnviz.core.tokens_display import markdown_literal
from attnviz.pagelogic.generation import reading
from attnviz.pagelogic.generation import sequence as gen_sequence
from attnviz.pagelogic.generation.decode import Generation
from attnviz.pagelogic.generation.systems import PagedDemo
from attnviz.viz.charts import bar_chart, line_chart
from attnviz.viz.generation import next_token_chart, sequence_heatmap
from attnviz.viz.inference import block_table_figure, memory_map_figure, ring_figure
from attnviz.viz.matrix import NARROW_FULL_WIDTH, matrix_heatmap
from attnviz.viz.style import token_labels


def next_token_figure(generation: Generation, step: int, labels: list[str], tokenizer, greedy: bool):
    """The most likely next tokens at ``step``, the one taken in orange."""
    chosen = generation.steps[step]
    bar_labels, probabilities, ids = gen_sequence.top_token_bars(tokenizer, chosen.top)
    taken = labels[len(generation.prompt_ids) + step]
    figure = next_token_chart(bar_labels, probabilities, ids, chosen=chosen.token_id,
                              pieces=gen_sequence.raw_pieces(tokenizer, ids),
                              title=f"Step {step + 1}: next-token distribution,<br>the {len(ids)} most likely")
    caption = ((f"The model's {len(ids)} most likely next tokens; greedy takes the first: " if greedy else
                f"The {len(ids)} most likely tokens of the distribution the token was drawn from (after temperature, "
                "top-k and top-p); chosen: ") + f"**{markdown_literal(taken)}** (orange). Marks: ␣ a space, ↵ a "
               "newline, <0xNN> a byte "
               "that is part of a character; #id where two tokens read alike.")
    return figure, caption


def step_attention_figure(generation: Generation, step: int, layer: int, head: int, labels: list[str], tokenizer):
    """The weights of the query that predicted ``step``'s token, over every earlier token."""
    chosen = generation.steps[step]
    what = "decoder self-attention" if generation.encoder_decoder else "attention"
    window = reading.window_statement(generation, step, layer)
    figure = bar_chart(token_labels(labels[: chosen.position]), chosen.attention[layer, head].tolist(),
                       title=f"Step {step + 1}: {what} of layer {layer}, head {head}", y_title="weight",
                       notes=gen_sequence.piece_notes(tokenizer, generation.ids[: chosen.position]))
    caption = ("The weights of the query that predicted this token (the last token read) over every earlier token"
               + (" of the decoder (its start token, then what it wrote)" if generation.encoder_decoder else "")
               + f"; {reading.row_sum_statement(generation, step, layer, head)}." + (f" {window}" if window else ""))
    return figure, caption


def timeline_figure(generation: Generation, step: int, layer: int, head: int, labels: list[str], tokenizer):
    """One row per generated token up to ``step``: its query's weights at absolute key positions."""
    sliding = layer < len(generation.layers) and generation.layers[layer].sliding
    matrix = reading.timeline(generation, layer, head)[: step + 1]  # [steps so far, positions]: grows with the Step
    written = generation.steps[: step + 1]
    n_prompt = len(generation.prompt_ids)
    rows = token_labels(labels[n_prompt: n_prompt + step + 1], [s.position for s in written])
    notes = gen_sequence.piece_notes(tokenizer, generation.ids)  # the hover adds each token's raw piece and id
    figure = matrix_heatmap(matrix, rows, token_labels(labels),
                            title=f"Timeline: each step's attention, layer {layer}, head {head}",
                            x_title="key position", y_title="generated token", show_values=False,
                            width=NARROW_FULL_WIDTH,  # its key labels thinned to fit a 900-px window too
                            row_notes=notes[n_prompt: n_prompt + step + 1], col_notes=notes)
    caption = (f"One row per generated token up to step {step + 1} (labelled by its position): its query's weights "
               "over the earlier tokens, each at its position. Grey: keys the query did not read, positions that did "
               "not exist yet" + (f" and keys out of layer {layer}'s sliding window of "
                                  f"{generation.layers[layer].window:,} tokens" if sliding else "")
               + ". Move the Step slider to watch it build up.")
    return figure, caption


def sink_figure(generation: Generation, layer: int):
    """Each head's share of weight on the first token, step by step (the attention sink)."""
    sink = reading.sink_mass(generation)[:, layer]  # [steps, heads]
    leaves = reading.first_token_leaves(generation, layer)
    figure = line_chart(list(range(1, len(generation.steps) + 1)),
                        {f"head {h}": sink[:, h].tolist() for h in range(sink.shape[1])},
                        title=f"Attention-sink mass: share on the first token, layer {layer}", x_title="step",
                        y_title="weight on token 0", markers=True)
    caption = ("Many decoders park attention on the first token when nothing else is relevant (Xiao et al., 2023): a "
               "head that keeps a large share there is a sink."
               + (" Here the first token is the decoder's start token; at step 1 it is the only key, so every head "
                  "puts 1 on it." if generation.encoder_decoder else "")
               + (f" From step {leaves} on, token 0 is out of layer {layer}'s sliding window of "
                  f"{generation.layers[layer].window:,} tokens: no query reads it, so its share is 0."
                  if leaves else ""))
    return figure, caption


def sequence_figure(weights, ids: list[int], labels: list[str], prompt_length: int, layer: int, head: int,
                    named: str | None, tokenizer):
    """The chosen head over the whole sequence, from its weights ``[n, n]`` (one cache-free forward pass)."""
    view = gen_sequence.sequence_view(weights, ids, labels, prompt_length)
    title = (f"Layer {layer}, head {head}{f' ({named})' if named else ''} over the whole sequence: every query, "
             "prompt and generated")
    if view.pooled:
        title += f"<br><sup>{view.n:,} x {view.n:,} max-pooled to {len(view.labels)} x {len(view.labels)}</sup>"
    notes = None if view.pooled else gen_sequence.piece_notes(tokenizer, ids)
    figure = sequence_heatmap(view.values, view.labels, view.segments, view.marks, title=title, notes=notes)
    return figure, gen_sequence.sequence_statement(view)


def cross_step_figure(generation: Generation, step: int, layer: int, head: int, sources: list[str]):
    """An encoder-decoder's cross-attention at ``step``: the new token's query over the source tokens."""
    figure = bar_chart(sources, generation.steps[step].cross_attention[layer, head].tolist(),
                       title=f"Step {step + 1}: cross-attention of layer {layer}, head {head} over the source",
                       y_title="weight")
    return figure, ("The same query's weights over the encoder's tokens (the prompt): which source tokens this "
                    "output token reads.")


def cross_timeline_figure(generation: Generation, layer: int, head: int, labels: list[str], sources: list[str]):
    """Every generated token's cross-attention over the whole source, one row each."""
    matrix = reading.cross_timeline(generation, layer, head)  # [steps, source tokens]
    rows = token_labels(labels[len(generation.prompt_ids):], [s.position for s in generation.steps])
    figure = matrix_heatmap(matrix, rows, sources, title=f"Cross-attention timeline, layer {layer}, head {head}",
                            x_title="source token", y_title="generated token", show_values=False)
    return figure, ("One row per generated token: its cross-attention over the whole source (a translation's "
                    "alignment shows up as a diagonal).")


def paged_figures(demo: PagedDemo) -> list[tuple]:
    """The block tables of the samples and the pool of physical blocks they read."""
    return [
        (block_table_figure(demo.cache, demo.names, title="Block tables: logical block → physical block"),
         "Orange: a physical block shared by several sequences (the prompt's full blocks); blue: a block "
         "one sequence owns. The number is the physical block."),
        (memory_map_figure(demo.cache, title="The pool of physical blocks"),
         "Every block of K/V memory in use; hover to see which sequences read it."),
    ]


def ring_trace_figure(trace):
    """Who holds which K/V block at each step of Ring attention."""
    return (ring_figure(trace.held, trace.status, title="Who holds which K/V block at each step"),
            f"Each step every device passes its block to the next. With the causal mask a device skips blocks "
            f"from later in the sequence: {trace.computed_share():.0%} of the device-steps compute.")
