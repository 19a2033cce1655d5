"""No control that does nothing: on every page (and every tab of the pages that have them), each control shown is
moved in turn, as a user would, and what the page shows (its figures, text, tables, metrics) must change. A control
that changes nothing visible should not be drawn in that state (issue: every screen makes its point).

Buttons are actions (each page's tests press them), and text boxes are typed into by the pages' own tests; the
rest are walked generically: a select box to its next option, a toggle flipped, a slider or number box one step, a
multiselect without its last choice."""

import json

import pytest

from tests.apptest_helpers import open_page

WALKED = ("selectbox", "radio", "segmented_control", "select_slider", "slider", "number_input", "toggle", "checkbox",
          "multiselect")

# page script, session state to open it with (a tab), and the controls known to need a state they are not in
PAGES = {
    "step by step": ("app_pages/step_by_step.py", {}),
    "scaling": ("app_pages/scaling.py", {"scale_samples": 500}),  # fewer samples: each move recomputes them
    "masks": ("app_pages/masks.py", {}),
    "positional, sinusoidal": ("app_pages/positional.py", {"pos_tab": "Sinusoidal"}),
    "positional, learned": ("app_pages/positional.py", {"pos_tab": "Learned"}),
    "positional, RoPE": ("app_pages/positional.py", {"pos_tab": "RoPE"}),
    "positional, ALiBi": ("app_pages/positional.py", {"pos_tab": "ALiBi"}),
    "explore, view": ("app_pages/explore_heads.py", {}),
    "explore, statistics": ("app_pages/explore_heads.py", {"explore_tab": "Head statistics"}),
    "explore, Q·K": ("app_pages/explore_heads.py", {"explore_tab": "Q·K"}),
    "explore, what-if": ("app_pages/explore_heads.py", {"explore_tab": "What-if"}),
    "heads and KV cache": ("app_pages/heads_kv_cache.py", {}),
    "flash": ("app_pages/flash.py", {"flash_n": 256}),
    "generation": ("app_pages/generation.py", {}),
    "corpus": ("app_pages/corpus.py", {}),
    "importance, circuit": ("app_pages/importance.py", {}),
    "importance, map": ("app_pages/importance.py", {"imp_view": "Importance map"}),
    "importance, patching": ("app_pages/importance.py", {"imp_view": "Activation patching"}),
    "over training": ("app_pages/over_training.py", {}),
    "queries and keys": ("app_pages/queries_keys.py", {"qk_documents": 2, "qk_tokens": 32}),  # small: t-SNE stays quick
    "checkpoints": ("app_pages/checkpoints.py", {}),
}


# Controls whose effect waits for an action the walk does not take, with the reason.
DEFERRED = {
    "ckpt_dtype": "the dtype the next checkpoint loads in: it acts when a Load button is pressed",
}


def shown(at) -> list[str]:
    """Everything the page's main area shows, as text: figures (their JSON), markdown, captions, tables,
    metrics, messages and formulas, and the labels of the controls drawn (a control that appears, or is greyed out,
    is a change)."""
    parts = [chart.proto.spec for chart in at.main.get("plotly_chart")]
    for kind in (*WALKED, "text_input", "text_area", "button"):  # a control greyed out (or back) is a change too
        parts += [f"{kind}: {widget.label}{' (disabled)' if widget.proto.disabled else ''}"
                  for widget in at.main.get(kind)]
    for kind in ("markdown", "caption", "metric", "info", "warning", "error", "success", "latex", "code", "subheader"):
        parts += [f"{kind}: {element.value}" for element in at.main.get(kind)]
    parts += [f"table: {frame.value.to_json()}" for kind in ("dataframe", "table") for frame in at.main.get(kind)]
    return parts


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def choose_label(widget, label: str, array: bool = False) -> None:
    """Chooses the option shown as ``label``, as the browser does: it sends the label, not the value (AppTest's
    own setters need the value, which a ``format_func`` hides from the test)."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    def state(self):
        chosen = WidgetState()
        chosen.id = self.id
        if array:
            chosen.string_array_value.data[:] = [label]
        else:
            chosen.string_value = label
        return chosen

    widget.__class__ = type(f"Chosen{type(widget).__name__}", (type(widget),), {"_widget_state": property(state)})


def move(widget, kind: str) -> str | None:
    """Moves ``widget`` as a user would; returns what was done (None: it cannot move, e.g. a disabled control or
    one with a single option)."""
    if widget.proto.disabled:
        return None
    if kind == "selectbox":
        options = widget.options
        if len(options) < 2:
            return None
        index = widget.index
        target = options[0 if index is None else (index + 1) % len(options)]
        choose_label(widget, target)
        return f"option {target!r}"
    if kind in ("radio", "segmented_control"):
        options = list(widget.options)
        if kind == "segmented_control":
            current = widget.formatted_values[0] if widget.formatted_values else None
        else:
            current = None if widget.index is None else options[widget.index]
        others = [option for option in options if option != current]
        if not others:
            return None
        choose_label(widget, others[0], array=kind == "segmented_control")
        return f"option {others[0]!r}"
    if kind == "select_slider":
        options = [_number(option) for option in widget.options]
        if len(options) < 2:
            return None
        index = options.index(widget.value) if widget.value in options else 0
        widget.set_value(options[(index + 1) % len(options)])
        return f"value {options[(index + 1) % len(options)]!r}"
    if kind in ("slider", "number_input"):
        value, step = widget.value, widget.step or 1
        if isinstance(value, (list, tuple)):
            return None
        low, high = widget.min, widget.max
        target = value + step if high is None or value + step <= high else value - step
        if low is not None and target < low:
            return None
        widget.set_value(type(value)(target) if isinstance(value, int) else target)
        return f"value {target!r}"
    if kind in ("toggle", "checkbox"):
        widget.set_value(not widget.value)
        return f"{'on' if widget.value else 'off'}"
    if kind == "multiselect":
        values = list(widget.value)
        if not values:
            widget.select(_number(widget.options[0]))
            return "first option added"
        widget.unselect(values[-1])
        return f"{values[-1]!r} removed"
    raise AssertionError(kind)


def controls(at) -> list[tuple[str, str]]:
    return [(kind, widget.key) for kind in WALKED for widget in at.main.get(kind) if widget.key]


@pytest.mark.parametrize("name", list(PAGES))
def test_every_control_changes_what_the_page_shows(name, clean_streamlit_caches):
    script, state = PAGES[name]
    at = open_page(script, **state)
    walked, idle = set(), []
    before = shown(at)
    for _ in range(3):  # moving a control may show others (a mask's window): walk those too
        pending = [(kind, key) for kind, key in controls(at) if key not in walked]
        if not pending:
            break
        for kind, key in pending:
            widgets = [widget for widget in at.main.get(kind) if widget.key == key]
            walked.add(key)
            if not widgets:
                continue  # an earlier move hid it (and the page changed for that move)
            if key in DEFERRED:
                continue
            done = move(widgets[0], kind)
            if done is None:
                continue
            submit = [button for button in at.main.get("button")
                      if widgets[0].form_id and button.key.startswith(f"FormSubmitter:{widgets[0].form_id}-")]
            if submit:  # a control in a form acts when the form is sent, as in the browser
                submit[0].click()
            at.run()
            assert not at.exception, (name, key, [problem.value for problem in at.exception])
            after = shown(at)
            if after == before:
                idle.append(f"{key} ({kind}, {done})")
            before = after
    assert walked, name
    assert idle == [], f"{name}: controls whose move changed nothing shown: {idle}"


def test_the_walk_sees_a_control_that_does_nothing():
    """The test above can fail: a page with a slider whose value is never used is caught."""
    from streamlit.testing.v1 import AppTest

    def script():
        import streamlit as st

        st.slider("Unused", 0, 10, 3, key="unused")
        st.markdown("The same text whatever the slider says.")

    at = AppTest.from_function(script).run()
    before = shown(at)
    move(at.slider(key="unused"), "slider")
    at.run()
    assert shown(at) == before and json.dumps(before)
