"""The bertviz tab (online only: bertviz's page loads require.js, d3 and jQuery from a CDN): its head view or
model view of a capture, with a note inside its frame when nothing could be drawn."""

from __future__ import annotations

from attnviz.models.record import Capture


def _inert_token(token: str) -> str:
    # bertviz writes tokens into a <script> with json.dumps, which leaves "</script>" intact: a typed or linked
    # sentence must not be able to inject markup, so angle brackets and ampersands become look-alikes.
    return token.replace("&", "＆").replace("<", "‹").replace(">", "›")


def bertviz_html(capture: Capture, kind: str, which: str) -> str:
    """bertviz's head view or model view for a captured attention kind, as an HTML string."""
    from bertviz import head_view, model_view

    record = capture.records[kind]
    attention = tuple(record.weights[layer].unsqueeze(0) for layer in range(record.n_layers))  # [1, heads, n, n] each
    tokens = [_inert_token(t) for t in record.key_display]  # as every page shows them ("␣the")
    if record.query_tokens != record.key_tokens:
        raise ValueError("bertviz shows self-attention; choose encoder or decoder attention")
    view = head_view if which == "head view" else model_view
    return BERTVIZ_OFFLINE_CHECK + view(attention, tokens, html_action="return").data


BERTVIZ_WAIT_MS = 6000  # how long bertviz gets to load its scripts from the CDN and draw
# bertviz's page fetches require.js, d3 and jQuery from a CDN: offline it draws nothing but an empty "Layer:"
# dropdown. This note, inside its frame, appears when nothing was drawn after BERTVIZ_WAIT_MS.
BERTVIZ_OFFLINE_CHECK = f"""
<div id="attnviz-bertviz-offline" style="display:none; font-family: sans-serif; padding: 12px; margin-bottom: 8px;
 background: #fff4e5; border: 1px solid #f0b46c; border-radius: 6px; color: #5c3b00;">
<b>bertviz did not load.</b> Its scripts (require.js, d3, jQuery) come from a CDN and could not be fetched: this
machine seems to be offline. Every other view of attnviz works offline: the Head, Grid and Lines views show the
same weights.
</div>
<script>
setTimeout(function () {{
  var drawn = document.querySelector('svg');
  if (typeof window.require === 'undefined' || !drawn) {{  // d3 and jQuery load as AMD modules, not globals
    document.getElementById('attnviz-bertviz-offline').style.display = 'block';
  }}
}}, {BERTVIZ_WAIT_MS});
</script>
"""
