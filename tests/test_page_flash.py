"""AppTest for "Flash vs naive", and the flash benchmark's pieces."""

import json

import numpy as np
import pytest
import torch

from attnviz.bench import flash_gpu
from attnviz.core.units import human_bytes, speed_ratio
from attnviz.flash import cpu_sweep
from attnviz.flash.cases import AttentionCase, measure_peak_memory
from attnviz.pagelogic import flash as flash_page
from attnviz.system import measure
from attnviz.system.gpus import gpu_bf16_peak
from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array


def results_table(at):
    return next(t.value for t in at.table if "backend" in t.value.columns)


def test_page_runs_backends_and_agrees_with_naive():
    at = open_page("app_pages/flash.py", flash_n=256)
    assert not at.exception, [e.value for e in at.exception]
    table = results_table(at)
    ran = table[table["ran as"] != "—"]
    assert {"naive", "tiled", "sdpa/flash", "sdpa/math"} <= set(ran["ran as"])
    assert all(float(x) < 1e-4 for x in ran["max |out − naive fp64|"])
    triton = table[table["backend"] == "Triton"].iloc[0]
    assert "switch on Triton interpreter" in triton["why not"]  # no GPU: the interpreter is opt-in


def test_interpreter_is_offered_for_small_n_only():
    at = open_page("app_pages/flash.py", flash_n=128)
    at.toggle(key="flash_interpreter").set_value(True).run()
    triton = results_table(at).set_index("backend").loc["Triton"]
    assert triton["ran as"] == "triton (interpreter)" and triton["median time"] == "correctness only"
    assert float(triton["max |out − naive fp64|"]) < 1e-4
    at.select_slider(key="flash_n").set_value(512).run()
    assert "would take minutes" in results_table(at).set_index("backend").loc["Triton", "why not"]


def test_tiling_figure_follows_the_mask():
    at = open_page("app_pages/flash.py", flash_n=256)
    at.selectbox(key="flash_mask").set_value("causal").run()
    tiles = plotly_array(figure_titled(at, "4 x 4 tiles")["data"][0]["z"])
    assert np.array_equal(tiles, np.array([[2, 0, 0, 0], [1, 2, 0, 0], [1, 1, 2, 0], [1, 1, 1, 2]]))
    converge = figure_titled(at, "The online softmax converging")
    gaps = plotly_array(converge["data"][0]["y"])
    assert gaps[-1] < 1e-6
    at.slider(key="flash_step").set_value(1).run()
    assert any("After key block **k0**" in m.value for m in at.markdown)


def test_bigbird_and_window_masks_on_the_page():
    at = open_page("app_pages/flash.py", flash_n=256)
    at.selectbox(key="flash_mask").set_value("bigbird").run()
    assert not at.exception
    table = results_table(at)
    assert all(float(x) < 1e-4 for x in table[table["ran as"] != "—"]["max |out − naive fp64|"])
    at.selectbox(key="flash_mask").set_value("sliding_causal").run()
    assert not at.exception and any("skipped" in c.value for c in at.caption)


def test_saved_benchmark_is_drawn():
    at = open_page("app_pages/flash.py", flash_n=128)
    assert any(s["layout"]["title"]["text"] == "Time vs N" for s in figures(at))


def test_flop_counts():
    assert cpu_sweep.attention_flops(1, 1, 1024, 64) == 4 * 1024 * 1024 * 64
    assert cpu_sweep.attention_flops(2, 3, 100, 8, causal=True) == 0.5 * 4 * 2 * 3 * 100 * 100 * 8
    assert cpu_sweep.attention_flops(1, 1, 10, 2, backward=True) == 3.5 * 4 * 100 * 2
    assert cpu_sweep.attention_flops(1, 1, 10, 2, density=0.25) == 0.25 * 4 * 100 * 2
    cases = flash_gpu.gpu_cases()
    assert len(cases) == 2 * 5 * 4 and {c["mask"] for c in cases} == {"full", "causal", "window", "bigbird"}


def test_naive_memory_at_128k_and_the_tile_per_head():
    assert flash_page.naive_peak_bytes(131072, 1, "fp16") == 2 * 131072**2 * 2  # the scores and the probabilities
    assert flash_page.naive_peak_bytes(1024, 4, "fp32") == 2 * 4 * 1024**2 * 4  # every head counts
    # masked: the scores with hidden keys at -inf too, and the bool mask
    assert flash_page.naive_peak_bytes(1024, 4, "fp32", masked=True) == (3 * 4 + 1) * 4 * 1024**2
    assert flash_page.flash_tile_bytes(64, 64) == 32 * 1024  # one head's tile: the page says "per head"


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_what_the_page_says_naive_holds_is_what_it_measures(mask):
    """The metric counts every N x N buffer naive attention holds at once: the peak measured in a fresh process
    (the page's own "Measure peak memory") is that, plus the inputs' small change."""
    case = AttentionCase(512, d=32, heads=4, mask=mask)
    stated = flash_page.naive_peak_bytes(case.n, case.heads, case.dtype, masked=mask != "full")
    measured = measure_peak_memory(case, "naive", timeout=120)
    assert 0.9 * stated <= measured <= 1.1 * stated, (measured / 2**20, stated / 2**20)
    at = open_page("app_pages/flash.py", flash_n=512, flash_heads=4, flash_mask=mask, flash_backends=["naive"])
    metric = next(m for m in at.metric if m.label.startswith("Naive's N x N buffers at N = 512"))
    assert metric.value == human_bytes(stated)


@pytest.mark.parametrize("gpu,peak", [("NVIDIA H200", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA A100-SXM4-80GB", 312),
                                      ("NVIDIA L4", 121), ("NVIDIA GeForce RTX 3090", None)])
def test_a_gpu_report_is_measured_against_the_peak_of_the_gpu_it_names(gpu, peak):
    rows = [{"n": n, "d": 128, "mask": "causal", "forward_tflops": {"FlashAttention": 100.0 + n / 1024}}
            for n in (1024, 4096)]  # the best: 104 TFLOPS
    report = {"benchmark": "flash-gpu", "gpu": gpu, "peak_tflops": 989.0, "results": rows}
    at = open_page("app_pages/flash.py", flash_n=128)
    at.radio(key="flash_scaling_source").set_value("upload a benchmark JSON").run()
    at.file_uploader(key="flash_upload").set_value(("report.json", json.dumps(report).encode(), "application/json")
                                                    ).run()
    assert not at.exception, [e.value for e in at.exception]
    caption = next(c.value for c in at.caption if "Higher is better" in c.value)
    assert "989" not in caption or peak == 989  # the report's own peak_tflops is not trusted
    if peak is None:
        assert "does not know" in caption and "%" not in caption  # achieved TFLOPS only
    else:
        assert f"{peak} TFLOPS" in caption and f"{104 / peak:.0%}" in caption


def test_speed_ratios_read_as_people_say_them():
    assert speed_ratio(10.0, 3.0) == "3.3x faster"
    assert speed_ratio(3.0, 10.0) == "3.3x slower"  # never "0.3x faster"
    assert speed_ratio(10.0, 10.2) == "as fast"
    assert speed_ratio(1.0, 50.0) == "50x slower"


def test_the_results_table_says_slower_when_a_backend_is_slower():
    at = open_page("app_pages/flash.py", flash_n=512, flash_backends=["naive", "sdpa/math", "tiled"])
    table = results_table(at).set_index("backend")
    naive_ms = float(table.loc["naive", "median time"].split()[0])
    for name in ("SDPA math", "tiled (PyTorch)"):
        ms = float(table.loc[name, "median time"].split()[0])
        word = table.loc[name, "vs naive"]
        assert not word.startswith("0.")
        if "slower" in word:
            assert ms >= 0.95 * naive_ms, (word, ms, naive_ms)
        elif "faster" in word:
            assert ms <= 1.05 * naive_ms, (word, ms, naive_ms)


def test_cpu_benchmark_smoke(tmp_path):
    from attnviz.bench.__main__ import main

    out = tmp_path / "flash.json"
    assert main(["flash", "--lengths", "256", "--heads", "2", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    last = report["results"][-1]
    assert set(last["time_s"]) == set(cpu_sweep.CPU_CONTENDERS)
    assert last["peak_bytes"]["naive"] > last["peak_bytes"]["sdpa/flash"]  # measured in fresh processes
    assert max(last["max_abs_diff_vs_naive"].values()) < 1e-4
    assert last["first_call_s"]["flex"] > last["time_s"]["flex"]  # compiling, reported apart from run time
    assert "environment" in report


def test_flex_attention_on_the_page_reports_its_compile_time_apart():
    at = open_page("app_pages/flash.py", flash_n=128, flash_backends=["naive", "flex"])
    assert not at.exception, [e.value for e in at.exception]
    flex = results_table(at).set_index("backend").loc["FlexAttention"]
    assert flex["ran as"] == "flex" and float(flex["max |out − naive fp64|"]) < 1e-4
    assert flex["first call"].endswith("(compiles)")
    assert float(flex["first call"].split()[0]) * 1000 > float(flex["median time"].split()[0])  # seconds vs ms


def test_gpu_benchmark_refuses_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="CUDA"):
        flash_gpu.bench_gpu(quick=True)


def test_peak_memory_is_measured_in_fresh_processes():
    case = AttentionCase(1024, d=32, heads=2)
    naive = measure_peak_memory(case, "naive")
    tiled = measure_peak_memory(case, "tiled")
    # the scores and the probabilities of 2 heads, 16 MiB; RSS may reuse a few pages the warm-up freed, so 90%
    assert naive >= 0.9 * (2 * 1024 * 1024 * 4 * 2)
    assert tiled < naive / 2
    with pytest.raises(measure.MeasurementUnavailable):
        measure_peak_memory(AttentionCase(64, d=16, heads=1), "triton")


def test_cases_are_seeded_and_round_trip_through_json():
    case = AttentionCase(96, d=16, heads=4, kv_heads=2, mask="bigbird", mask_params=(("block_size", 16),), seed=3)
    again = AttentionCase.from_json(case.to_json())
    assert again == case
    for first, second in zip(case.tensors(), again.tensors(), strict=True):
        assert torch.equal(first, second)
    assert case.tensors()[1].shape == (1, 2, 96, 16)
    assert case.mask_spec().block_layout.shape == (6, 6)


def test_page_measures_memory_on_request():
    at = open_page("app_pages/flash.py", flash_n=512, flash_backends=["naive", "sdpa/flash"])
    at.button(key="flash_measure_memory").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = results_table(at).set_index("backend")
    assert table.loc["naive", "peak memory"].endswith("MiB")


def test_gpu_benchmark_code_runs_on_cpu_in_the_interpreter():
    """The GPU run cannot happen here; this executes the same code on CPU tensors (Triton interpreter, tiny sizes)
    so that what runs on the GPU machine has run before, except CUDA's own timer and kernels."""
    times = iter(range(1, 10_000))
    report = flash_gpu.bench_gpu(device="cpu", timer=lambda function: (function(), float(next(times)))[1],
                                   batch=1, heads=2, lengths=[128], head_dims=(64,), window=32, bigbird_block=32,
                                   progress=lambda line: None)
    assert [row["mask"] for row in report["results"]] == ["full", "causal", "window", "bigbird"]
    for row in report["results"]:
        assert "triton" in row["forward_ms"] and "triton" in row["forward_backward_ms"]
        assert row["max_abs_diff_vs_sdpa"] < 1e-4  # our kernel agrees with PyTorch's SDPA on the same mask
        assert row["flex_max_abs_diff_vs_sdpa"] < 1e-4  # so does FlexAttention with our mask as a BlockMask
        assert row["first_call_ms"]["flex"] > 0 and "flex" in row["forward_ms"]
        assert "flex" not in row["forward_backward_ms"] and "grad" in row["errors"]["flex"]  # needs a GPU
        assert "sdpa/cudnn" in row["errors"]  # no cuDNN on a CPU: reported, not fatal
    lines = flash_gpu.print_gpu(report)
    assert any("TFLOPS" in line or "triton TF" in line for line in lines)
    assert any("causal / non-causal" in line for line in lines)
    assert any("flex compile" in line for line in lines)
    assert report["peak_tflops"] is None and any("peak = unknown for CPU" in line for line in lines)
    assert flash_gpu.share_of_peak(400.0, gpu_bf16_peak("NVIDIA H200")) == f"{400 / 989:.1%}"


def test_other_widgets_do_not_re_measure_and_measure_again_does():
    at = open_page("app_pages/flash.py", flash_n=512)
    first = results_table(at)["median time"].tolist()
    at.select_slider(key="flash_block_q").set_value(32).run()  # the tiling's own slider
    assert results_table(at)["median time"].tolist() == first  # the same measurement, not a new one
    assert len(at.session_state["flash_results"]) == 1
    at.button(key="flash_again").click().run()
    assert not at.exception
    assert len(at.session_state["flash_results"]) == 1  # measured again for the same settings, not added


def test_sessions_share_one_measurement_of_the_same_settings():
    first = open_page("app_pages/flash.py", flash_n=384)
    second = open_page("app_pages/flash.py", flash_n=384)  # another session, the same settings
    assert not second.exception, [e.value for e in second.exception]
    assert results_table(second)["median time"].tolist() == results_table(first)["median time"].tolist()
    caption = next(c.value for c in second.caption if c.value.startswith("Measured on this server at"))
    assert caption == next(c.value for c in first.caption if c.value.startswith("Measured on this server at"))
    second.button(key="flash_again").click().run()  # a fresh run, and the first session sees it on its next rerun
    first.run()
    assert results_table(first)["median time"].tolist() == results_table(second)["median time"].tolist()


def test_the_page_opens_on_a_causal_mask_and_the_steppers_first_step():
    at = open_page("app_pages/flash.py", flash_n=256)
    assert at.selectbox(key="flash_mask").value == "causal"
    assert any("skipped" in c.value and not c.value.startswith("0%") for c in at.caption)
    stepper = at.slider(key="flash_step")
    assert stepper.value == 1 and stepper.max > 1  # the followed query block consumes several key blocks
    assert any("After key block **k0**" in m.value for m in at.markdown)
