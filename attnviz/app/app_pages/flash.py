"""Flash vs naive: the same output without ever holding the N x N matrix, measured live."""

import json
import time

import pandas as pd
import streamlit as st
import torch

from attnviz.core import mask_patterns
from attnviz.core.units import TORCH_DTYPES, human_bytes, speed_ratio
from attnviz.flash.cases import measure_peak_memory
from attnviz.flash.cpu_sweep import RECORDED_SWEEPS
from attnviz.flash.dispatch import CONTENDERS
from attnviz.pagelogic import flash as flash_page
from attnviz.system import measure
from attnviz.ui.caches.flash import cached_tiling
from attnviz.ui.caches.shared_measurements import shared_measurements
from attnviz.ui.figures import figure_once, show_figure
from attnviz.ui.frame import figure_columns, page_intro, setup_area, start_page, transient_status
from attnviz.ui.pattern_widgets import pattern_widgets
from attnviz.viz.charts import line_chart
from attnviz.viz.matrix import SIGNED, mask_heatmap, matrix_heatmap

TILE_FIGURE_WIDTH = 400  # px: the least the tile map's column is drawn at
FLASH_JSON_MB = 4  # a benchmark's JSON is a few KB


def controls(gpu: bool) -> dict:
    """The inputs that make the point on the first row (size, mask, the interpreter); backends, K/V heads and dtype
    in the setup area (on a projector, a closed expander)."""
    columns = st.columns([2, 2, 2, 3, 2, 4])
    chosen = {
        "n": columns[0].select_slider("N (tokens)", [64, 128, 256, 512, 1024, 2048, 4096], flash_page.DEFAULT_N,
                                      key="flash_n",
                                      bind="query-params"),
        "d": columns[1].select_slider("Head dim d", [16, 32, 64, 128], flash_page.DEFAULT_D, key="flash_d"),
        "heads": columns[2].select_slider("Heads", [1, 2, 4, 8, 16], flash_page.DEFAULT_HEADS, key="flash_heads"),
    }
    flash_masks = flash_page.flash_masks()
    chosen["mask"] = columns[3].selectbox("Mask", flash_masks, format_func=flash_page.mask_label,
                                          index=flash_masks.index(flash_page.DEFAULT_MASK), key="flash_mask",
                                          bind="query-params")
    chosen["mask_params"] = pattern_widgets(chosen["mask"], mask_patterns.FLASH, columns[4:5], chosen["n"],
                                            prefix="flash")
    chosen["interpreter"] = False
    if not gpu:
        chosen["interpreter"] = columns[5].toggle(
            "Triton interpreter", value=flash_page.interpreter_by_default(chosen["n"]), key="flash_interpreter",
            help="No GPU here: Triton can run its kernel in a CPU interpreter, slowly, for N <= "
                 f"{flash_page.INTERPRETER_LIMIT}. Correctness only: its time is not shown.",
        )
    with setup_area("Backends, K/V heads and dtype"):
        columns = st.columns([6, 2, 2])
        chosen["names"] = columns[0].multiselect("Backends", list(CONTENDERS),
                                                 default=list(flash_page.DEFAULT_CONTENDERS),
                                                 format_func=lambda key: CONTENDERS[key].label, key="flash_backends")
        chosen["kv_heads"] = columns[1].selectbox(
            "K/V heads", [h for h in (1, 2, 4, 8, 16) if chosen["heads"] % h == 0 and h <= chosen["heads"]],
            index=None, placeholder=f"{chosen['heads']} (MHA)", key="flash_kv_heads",
        ) or chosen["heads"]
        chosen["dtype"] = columns[2].selectbox("dtype", list(TORCH_DTYPES),
                                               index=list(TORCH_DTYPES).index(flash_page.DEFAULT_DTYPE),
                                               key="flash_dtype")
    return chosen


def measured_rows(case, chosen: dict, gpu: bool) -> list:
    """The backends' results for these inputs: measured once on this server and shared by every session (one
    measurement at a time, so that sessions do not slow each other's timings), again only when asked. A rerun from
    another widget (e.g. the tiling's sliders) does not re-measure."""
    key = flash_page.measurement_key(case, chosen["names"], chosen["interpreter"])
    again = st.session_state.pop("flash_measure_again", False)
    seen = st.session_state.setdefault("flash_results", {})  # this session's settings, newest last (16 at most)
    names = chosen["names"]
    where = "GPU: " + torch.cuda.get_device_name() if gpu else "CPU"

    def measure():
        with transient_status(f"Running {len(names)} backends on N = {case.n} ({where})…") as status:
            return flash_page.run_contenders(
                case, names, allow_interpreter=chosen["interpreter"],
                progress=lambda index, name: status.update(label=f"Running {name} ({index + 1}/{len(names)})…"),
            )

    rows, measured_at = shared_measurements().get(
        key, measure, again=again, waiting=transient_status("Waiting for another session's measurement to finish…"))
    seen.pop(key, None)
    seen[key] = measured_at
    while len(seen) > 16:  # a bounded memory of past settings
        seen.pop(next(iter(seen)))
    return rows, measured_at


def first_call(row) -> str:
    """The first call's time, short enough for its column: FlexAttention compiles then (seconds, said so)."""
    if row.first_ms is None:
        return "—"
    if row.name == "flex":
        return f"{row.first_ms / 1000:.1f} s (compiles)"
    return f"{row.first_ms:.0f} ms"


def results_section(case, chosen: dict, gpu: bool) -> None:
    rows, measured_at = measured_rows(case, chosen, gpu)
    naive_ms = next((r.median_ms for r in rows if r.name == "naive" and r.median_ms), None)
    table = pd.DataFrame(
        {
            "backend": [r.label for r in rows],
            "ran as": [r.ran or "—" for r in rows],
            "max |out − naive fp64|": [f"{r.max_abs_diff:.1e}" if r.max_abs_diff is not None else "—" for r in rows],
            "median time": [f"{r.median_ms:.1f} ms" if r.median_ms else ("correctness only" if r.ran else "—")
                            for r in rows],
            "vs naive": [speed_ratio(naive_ms, r.median_ms) if naive_ms and r.median_ms and r.name != "naive" else ""
                         for r in rows],
            "first call": [first_call(r) for r in rows],
            "why not": [r.reason or "" for r in rows],
        }
    )
    memory_key = ("flash_memory", case)
    measured = st.session_state.get("flash_measured", {}).get(memory_key, {})
    if gpu:  # on a GPU every run measures the allocator's peak as it goes
        measured = {r.name: r.peak_bytes for r in rows if r.peak_bytes is not None}
    if measured:
        table.insert(4, "peak memory", [human_bytes(measured[r.name]) if isinstance(measured.get(r.name), int)
                                        else measured.get(r.name, "—") for r in rows])
    # A static table: its cells wrap, so every column shows whole in a 900-px window (a data grid scrolled sideways
    # and hid "why not" there).
    st.table(table, hide_index=True, border="horizontal")
    st.caption(f"Measured on this server at {time.strftime('%H:%M:%S', time.localtime(measured_at))}, one "
               "measurement at a time; every session with these settings sees the same run. **Measure again** for a "
               "fresh one. The first call is not in the median: FlexAttention compiles its kernel then.")
    st.button("Measure again", key="flash_again", on_click=lambda: st.session_state.update(flash_measure_again=True),
              help="Times are measured once for these settings; measure them again (the machine may be busy).")
    cpu_names = [r.name for r in rows if r.ran and not r.ran.startswith("triton")]
    if not gpu and cpu_names and st.button(
        "Measure peak memory (a fresh process per backend, a few seconds each)", key="flash_measure_memory"
    ):
        results = {}
        with st.status("Measuring peak memory…") as status:
            for index, name in enumerate(cpu_names):
                status.update(label=f"Measuring {CONTENDERS[name].label} ({index + 1}/{len(cpu_names)}) in a fresh "
                                    "process…")
                try:
                    results[name] = measure_peak_memory(case, name, timeout=120)
                except (measure.MeasurementUnavailable, OSError, ValueError) as problem:
                    results[name] = f"not measured: {problem}"
            status.update(label="Peak memory measured", state="complete")
        st.session_state.setdefault("flash_measured", {})[memory_key] = results
        st.rerun()


def memory_metrics(case) -> None:
    metrics = st.columns(3)
    masked = not case.mask_spec().is_full
    metrics[0].metric(f"Naive's N x N buffers at N = {case.n:,}",
                      human_bytes(flash_page.naive_peak_bytes(case.n, case.heads, case.dtype, case.batch,
                                                              masked=masked)),
                      help=flash_page.naive_memory_note(case))
    metrics[1].metric("Naive's N x N buffers at N = 131,072",
                      human_bytes(flash_page.naive_peak_bytes(131072, case.heads, case.dtype, case.batch,
                                                              masked=masked)),
                      help=f"The same {flash_page.naive_buffers(masked)} buffers{' and mask' if masked else ''}, "
                           f"{case.heads} heads, batch {case.batch}, {case.dtype}.")
    tiled = CONTENDERS["tiled"].options
    tiled_bytes = flash_page.flash_tile_bytes(tiled["block_q"], tiled["block_k"]) * case.heads
    metrics[2].metric("A 64 x 64 flash tile holds, per head", human_bytes(flash_page.flash_tile_bytes(64, 64)),
                      help="one fp32 tile of scores and its exponentials, whatever N is. The 'tiled (PyTorch)' "
                           f"backend in the table uses {tiled['block_q']} x {tiled['block_k']} tiles for all "
                           f"{case.heads} heads at once: {human_bytes(tiled_bytes)}")
    where = ("measured by CUDA's allocator in this process, around one call" if case.device == "cuda" else
             "measured in a fresh process per backend")
    st.caption(
        f"Differences are against naive attention in fp64 on the same inputs. Peak memory is the extra memory of one "
        f"call, {where}; `python -m attnviz.bench flash` measures it across N."
    )


def stepper(trace, output, block_q: int, block_k: int, trace_block: int, drawn: tuple) -> None:
    """``drawn``: what names the trace (the case and the tiling), for the figures' cache."""
    steps = trace.steps
    if not steps:
        st.info("This query block attends to no key block under this mask.")
        return
    # From the first step: "so far" differs from "final" until the last key block is in. A mask whose query block
    # sees a single key block (block-diagonal chunks) has one step: no slider then (Streamlit refuses a 1..1 one).
    step = st.slider("Step: key blocks consumed", 1, len(steps), 1, key="flash_step") if len(steps) > 1 else 1
    state = steps[step - 1]
    final = output[0, 0, trace_block * block_q : (trace_block + 1) * block_q]
    rows_shown = min(8, state.running_max.shape[0])
    numbers = pd.DataFrame(
        {
            "query": [trace_block * block_q + i for i in range(rows_shown)],
            "running max m": state.running_max[:rows_shown].tolist(),
            "running sum ℓ": state.running_sum[:rows_shown].tolist(),
            "output[0] so far": state.output[:rows_shown, 0].tolist(),
            "output[0] final": final[:rows_shown, 0].tolist(),
        }
    )
    st.markdown(
        f"After key block **k{state.key_block}** ({state.status}): each row keeps m (largest score seen), ℓ "
        "(sum of e^(s − m)) and the output so far; a new block with a larger max rescales ℓ and the output by "
        "e^(m_old − m_new)."
    )
    st.table(numbers.style.format(precision=4).hide(axis="index"), border="horizontal")  # wraps: no sideways scroll
    def converging():
        gaps = [max((s.output - final).abs().max().item(), 1e-16) for s in steps]  # 1e-16 stands for 0 on a log axis
        figure = line_chart(list(range(1, len(steps) + 1)), {"max |output so far − final|": gaps},
                            title="The online softmax converging", x_title="key blocks consumed",
                            y_title="difference", markers=True, log_y=True, height=280)
        # Whole blocks on x (no 1.5); powers of ten as 1e-6, not SI prefixes (1µ, 1n, 1f read as units).
        figure.update_xaxes(tickmode="linear", tick0=1, dtick=max(1, -(-len(steps) // 12)))
        return figure.update_yaxes(exponentformat="e", dtick=2, minorloglabels="none")

    show_figure(
        figure_once(("flash converging", drawn), converging),
        "Exactly the final answer once the last block is in: nothing was approximated, only reordered.",
        key="flash_converge",
    )
    if state.scores is not None:
        shown = state.scores[:16, :16]
        show_figure(
            figure_once(("flash tile scores", drawn, step), lambda: matrix_heatmap(
                shown, [f"q{trace_block * block_q + i}" for i in range(shown.shape[0])],
                [f"k{state.key_block * block_k + j}" for j in range(shown.shape[1])],
                title=f"The tile's scaled scores (first 16 x 16), key block k{state.key_block}",
                scale=SIGNED, show_values=False, height=360, width=TILE_FIGURE_WIDTH)),  # in the tiling's column
            "Grey cells are masked (−∞) inside a diagonal or edge tile.",
            key="flash_tile_scores",
        )


def tiling_section(case) -> None:
    st.subheader("The tiling")
    columns = st.columns(3)
    block_q = columns[0].select_slider("Query block", [16, 32, 64, 128], flash_page.DEFAULT_BLOCK, key="flash_block_q")
    block_k = columns[1].select_slider("Key block", [16, 32, 64, 128], flash_page.DEFAULT_BLOCK, key="flash_block_k")
    layout_block = flash_page.layout_block_size(case)
    if layout_block:
        block_q = block_k = layout_block  # block-sparse tiles are the layout's blocks
    n_query_blocks = -(-case.n // block_q)
    trace_block = columns[2].slider("Follow query block", 0, n_query_blocks - 1,
                                    flash_page.default_trace_block(n_query_blocks), key="flash_trace_block")
    output, trace = cached_tiling(repr(case), case, block_q, block_k, trace_block)
    drawn = (repr(case), block_q, block_k, trace_block)
    codes = torch.tensor([[flash_page.STATUS_CODES[s] for s in row] for row in trace.status])
    legend = {0: ("#ffffff", "skipped"), 1: ("#2f6db5", "computed"), 2: ("#ff9f1c", "computed + masked")}
    counts = trace.counts()
    left, right = figure_columns(2, key="flash_tiling", min_width=TILE_FIGURE_WIDTH)
    with left:
        show_figure(
            # Block numbers, thinned to what the narrow column has room for ("k0".."k15" overlapped there).
            figure_once(("flash tiles", drawn), lambda: mask_heatmap(
                codes, [str(i) for i in range(trace.n_query_blocks)], [str(j) for j in range(trace.n_key_blocks)],
                title=f"{trace.n_query_blocks} x {trace.n_key_blocks} tiles of {block_q} x {block_k}",
                legend=legend, height=420, x_title="key block", y_title="query block", width=TILE_FIGURE_WIDTH)),
            f"{counts['computed']} tiles computed as they are, {counts['masked']} with an element mask (the diagonal "
            f"or window edge), {counts['skipped']} never touched: "
            f"{counts['skipped'] / max(sum(counts.values()), 1):.0%} of the work skipped.",
            key="flash_tiles",
        )
    with right:
        stepper(trace, output, block_q, block_k, trace_block, drawn)


def saved_or_uploaded_report(chosen: dict):
    saved = sorted(RECORDED_SWEEPS.glob("flash-*.json")) if RECORDED_SWEEPS.exists() else []
    source = st.radio("Data", ["saved benchmark", "upload a benchmark JSON", "live sweep (small N)"], horizontal=True,
                      key="flash_scaling_source")
    if source == "saved benchmark":
        if saved:
            chosen_file = st.selectbox("Benchmark", saved, format_func=lambda p: p.name, key="flash_saved")
            return json.loads(chosen_file.read_text())
        st.info("No saved benchmark ships with this installation: upload the JSON that `python -m attnviz.bench flash` "
                "writes.")
        return None
    if source == "upload a benchmark JSON":
        uploaded = st.file_uploader("JSON from python -m attnviz.bench flash", type=["json"], key="flash_upload",
                                    max_upload_size=FLASH_JSON_MB)
        if uploaded is None:
            return None
        if uploaded.size > FLASH_JSON_MB * 1024**2:
            st.error(f"That file is {uploaded.size / 1024**2:,.1f} MB; a benchmark's JSON is at most "
                     f"{FLASH_JSON_MB} MB.")
            return None
        try:
            report = json.loads(uploaded.getvalue().decode("utf-8"))
            if not isinstance(report, dict) or "results" not in report:
                raise ValueError("no 'results'")
            return report
        except (UnicodeDecodeError, ValueError) as problem:
            st.error(f"That is not a benchmark JSON from attnviz ({problem}).")
            return None
    if st.button("Run a sweep over N = 256 … 2048", key="flash_sweep"):
        from attnviz.flash.cpu_sweep import bench_cpu

        with st.status("Sweeping…") as status:
            report = bench_cpu([256, 512, 1024, 2048], heads=chosen["heads"], d=chosen["d"], repeats=3, memory=False,
                               progress=lambda line: status.update(label=line.strip()))
            status.update(label="Sweep done", state="complete")
        return report
    return None


def scaling_section(chosen: dict) -> None:
    st.subheader("Scaling with N")
    report = saved_or_uploaded_report(chosen)
    if report is not None and report.get("benchmark") == "flash-cpu":
        results = report["results"]
        lengths = [row["n"] for row in results]
        names_in = list(results[0]["time_s"])
        left, right = figure_columns(2, key="flash_scaling", min_width=400)
        with left:
            show_figure(
                line_chart(lengths, {name: [row["time_s"][name] * 1000 for row in results] for name in names_in},
                           title="Time vs N", x_title="N", y_title="ms", log_x=True, log_y=True, markers=True),
                "Every contender does O(N²) work; flash wins on memory traffic, not on arithmetic.",
                key="flash_scaling_time",
            )
        with right:
            if results[0].get("peak_bytes"):
                show_figure(
                    line_chart(lengths,
                               {name: [row["peak_bytes"][name] / 2**20 for row in results] for name in names_in},
                               title="Peak extra memory vs N (fresh process per point)", x_title="N", y_title="MiB",
                               log_x=True, log_y=True, markers=True),
                    "Naive grows as N² (the score matrix); tiled and SDPA flash grow as N (the output).",
                    key="flash_scaling_memory",
                )
            else:
                st.info("This sweep did not measure memory (that needs a fresh process per point: see the benchmark).")
    elif report is not None and report.get("benchmark") == "flash-gpu":
        results = [row for row in report["results"] if row["mask"] == "causal" and row["d"] == 128] or report["results"]
        lengths = sorted({row["n"] for row in results})
        labels = sorted({label for row in results for label in row["forward_tflops"]})
        series = {label: [next((r["forward_tflops"].get(label) for r in results if r["n"] == n), None) for n in lengths]
                  for label in labels}
        show_figure(
            line_chart(lengths, series, title=f"Forward TFLOPS on {report.get('gpu', 'GPU')} ({results[0]['mask']}, "
                                              f"d = {results[0]['d']})", x_title="N", y_title="TFLOPS", log_x=True,
                       markers=True),
            flash_page.tflops_caption(report.get("gpu"), max((value for values in series.values() for value in values
                                                              if value is not None), default=None)),
            key="flash_scaling_gpu",
        )


def main() -> None:
    start_page("Flash vs naive")
    page_intro(
        "Naive attention writes all N x N scores to memory, then softmaxes them. Flash attention walks over key "
        "blocks keeping only a running max, a running sum and a rescaled output per query: same answer, O(N) memory."
    )
    gpu = torch.cuda.is_available()
    chosen = controls(gpu)
    case = flash_page.page_case(chosen["n"], chosen["d"], chosen["heads"], chosen["kv_heads"], chosen["dtype"],
                                chosen["mask"], chosen["mask_params"])
    layout_block = flash_page.layout_block_size(case)
    if layout_block and case.n % layout_block:
        st.warning(f"{flash_page.mask_label(case.mask)}: blocks of {layout_block} need N to be a multiple of "
                   f"{layout_block}.")
        st.stop()
    results_section(case, chosen, gpu)
    memory_metrics(case)
    tiling_section(case)
    scaling_section(chosen)


main()
